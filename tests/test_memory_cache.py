"""The in-process exact cache (LRU bounded in bytes) and the canonical cache key."""

from __future__ import annotations

import copy
import random
import secrets
import sys
import tracemalloc
from typing import Any

import pytest

from gateway.cache import exact
from gateway.cache.exact import MemoryCache
from gateway.cache.keys import canonical_key, is_deterministic

cost = exact.entry_cost  # the key's and value's objects plus the entry's bookkeeping


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(exact.time, "monotonic", c)
    return c


# ----------------------------------------------------------------------------- MemoryCache
async def test_get_set_and_size() -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=1_000)
    assert await c.get("a") is None
    await c.set("a", b"hello", ttl=60)
    assert await c.get("a") == b"hello"
    assert len(c) == 1
    assert c.size_bytes == cost("a", b"hello") > len("a") + len(b"hello")
    assert await c.ping() is True


async def test_lru_eviction_order() -> None:
    v = b"x" * 36
    one = cost("a", v)  # every one-letter key costs the same
    c = MemoryCache(max_bytes=3 * one, max_entry_bytes=1_000)
    for k in "abc":
        await c.set(k, v, ttl=60)
    assert len(c) == 3 and c.size_bytes == 3 * one
    assert await c.get("a") == v  # a is now the most recently used: b is the oldest
    await c.set("d", v, ttl=60)
    assert await c.get("b") is None
    assert [await c.get(k) is not None for k in "acd"] == [True, True, True]
    # order now (oldest first): a, c, d -> touching in that order keeps it; e evicts a
    await c.set("e", v, ttl=60)
    assert await c.get("a") is None
    assert {k for k in "abcde" if k in c._data} == {"c", "d", "e"}
    assert c.size_bytes == 3 * one


async def test_a_large_entry_evicts_as_many_as_needed() -> None:
    small, big = cost("a", b"y" * 10), cost("big", b"z" * 200)
    c = MemoryCache(max_bytes=small + big, max_entry_bytes=big)
    for k in "abcd":
        await c.set(k, b"y" * 10, ttl=60)
    await c.set("big", b"z" * 200, ttl=60)  # a, b and c must go: 4 small + big - 3 small fits
    assert [k in c._data for k in ("a", "b", "c", "d", "big")] == [False, False, False, True, True]
    assert c.size_bytes == small + big


async def test_overwrite_keeps_accounting_exact() -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=5_000)
    await c.set("k", b"a" * 100, ttl=60)
    await c.set("k", b"b" * 10, ttl=60)
    await c.set("k", b"c" * 1000, ttl=60)
    assert len(c) == 1
    assert c.size_bytes == cost("k", b"c" * 1000)
    assert await c.get("k") == b"c" * 1000


async def test_overwrite_moves_the_entry_to_most_recent() -> None:
    v = b"v" * 36
    c = MemoryCache(max_bytes=2 * cost("a", v), max_entry_bytes=1_000)
    await c.set("a", v, ttl=60)
    await c.set("b", v, ttl=60)
    await c.set("a", v, ttl=60)  # refresh a: b is the oldest now
    await c.set("c", v, ttl=60)
    assert await c.get("b") is None
    assert await c.get("a") == v


@pytest.mark.parametrize("value_bytes", [200, 1_000, 8_000])
async def test_accounted_bytes_are_the_memory_the_entries_hold(value_bytes: int) -> None:
    """``max_bytes`` bounds the real memory: the accounted size is within 10% of what the
    entries allocate (tracemalloc), for answers of a few hundred bytes to several KB. The
    old charge (payload + 64 B) left small entries ~25% under their real cost."""
    c = MemoryCache(max_bytes=1 << 40, max_entry_bytes=1 << 30)
    keys = [secrets.token_hex(32) for _ in range(3_000)]  # cache keys are 64-hex digests
    values = [secrets.token_bytes(value_bytes) for _ in keys]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k, v in zip(keys, values, strict=True):
            await c.set(k, v, ttl=60)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # the keys' and values' objects existed before: what the cache added is its bookkeeping
    real = held + sum(map(sys.getsizeof, keys)) + sum(map(sys.getsizeof, values))
    assert abs(c.size_bytes - real) <= 0.10 * real, (c.size_bytes, real)


async def test_accounting_never_drifts_under_random_operations(clock: Clock) -> None:
    rng = random.Random(1234)
    c = MemoryCache(max_bytes=5_000, max_entry_bytes=1_500)
    for _ in range(3_000):
        key = f"k{rng.randrange(40)}"
        op = rng.random()
        if op < 0.6:
            await c.set(key, b"x" * rng.randrange(0, 1_600), ttl=rng.choice([0.5, 5, 60]))
        elif op < 0.95:
            await c.get(key)
        else:
            clock.now += rng.random()
        expected = sum(cost(k, v) for k, (_, v) in c._data.items())
        assert c.size_bytes == expected
        assert 0 <= c.size_bytes <= 5_000
    await c.aclose()
    assert c.size_bytes == 0 and len(c) == 0


async def test_ttl_expiry(clock: Clock) -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=1_000)
    await c.set("k", b"v", ttl=10)
    clock.now += 9.9
    assert await c.get("k") == b"v"
    clock.now += 0.2
    assert await c.get("k") is None
    assert len(c) == 0 and c.size_bytes == 0  # the expired entry is dropped, bytes released


async def test_ttl_is_per_entry(clock: Clock) -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=1_000)
    await c.set("short", b"1", ttl=1)
    await c.set("long", b"2", ttl=100)
    clock.now += 5
    assert await c.get("short") is None
    assert await c.get("long") == b"2"


async def test_overwrite_renews_the_ttl(clock: Clock) -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=1_000)
    await c.set("k", b"old", ttl=10)
    clock.now += 8
    await c.set("k", b"new", ttl=10)
    clock.now += 8
    assert await c.get("k") == b"new"


async def test_oversized_entry_is_skipped() -> None:
    limit = cost("k", b"x" * 50)
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=limit)
    await c.set("k", b"x" * 50, ttl=60)  # exactly at the limit: kept
    assert await c.get("k") is not None
    await c.set("big", b"x" * (limit - cost("big", b"") + 1), ttl=60)  # one byte over
    assert await c.get("big") is None
    assert len(c) == 1 and c.size_bytes == limit


async def test_oversized_overwrite_drops_the_stale_value() -> None:
    c = MemoryCache(max_bytes=10_000, max_entry_bytes=600)
    await c.set("k", b"old answer", ttl=60)
    assert await c.get("k") == b"old answer"
    await c.set("k", b"x" * 1_000, ttl=60)  # a newer answer too large to keep
    assert await c.get("k") is None
    assert len(c) == 0 and c.size_bytes == 0


async def test_entry_larger_than_the_whole_cache_never_goes_negative() -> None:
    c = MemoryCache(max_bytes=100, max_entry_bytes=1_000)
    await c.set("a", b"x", ttl=60)
    await c.set("huge", b"x" * 500, ttl=60)
    assert c.size_bytes >= 0
    assert c.size_bytes <= 100
    assert await c.get("a") is None


async def test_aclose_empties() -> None:
    c = MemoryCache(max_bytes=1_000, max_entry_bytes=1_000)
    await c.set("a", b"1", ttl=60)
    await c.aclose()
    assert len(c) == 0 and c.size_bytes == 0
    assert await c.get("a") is None


# ----------------------------------------------------------------------------- canonical_key
BODY: dict[str, Any] = {
    "model": "auto",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "temperature": 0,
    "top_p": 1,
    "max_tokens": 50,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "parameters": {"type": "object", "properties": {"x": {"type": "number"}}},
            },
        }
    ],
    "response_format": {"type": "json_object"},
}


def key(body: dict[str, Any], tenant: str = "team-a", route: str = "auto", endpoint: str = "chat") -> str:
    return canonical_key(tenant, route, endpoint, body)


def changed(**fields: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    body.update(fields)
    return body


def test_key_is_a_stable_sha256_hex() -> None:
    k = key(BODY)
    assert len(k) == 64 and all(ch in "0123456789abcdef" for ch in k)
    assert key(copy.deepcopy(BODY)) == k


def test_key_differs_by_tenant_route_and_endpoint() -> None:
    base = key(BODY)
    assert key(BODY, tenant="team-b") != base
    assert key(BODY, route="chat-cheap") != base
    assert key(BODY, endpoint="completions") != base
    # no ambiguity from concatenating the parts
    assert canonical_key("ab", "c", "chat", BODY) != canonical_key("a", "bc", "chat", BODY)


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.2},
        {"top_p": 0.9},
        {"max_tokens": 51},
        {"seed": 7},
        {"n": 2},
        {"stop": ["\n"]},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"logit_bias": {"50256": -100}},
        {"logprobs": True},
        {"top_logprobs": 2},
        {"tool_choice": "required"},
        {"parallel_tool_calls": False},
        {"reasoning_effort": "high"},
        {"model": "small"},
    ],
    ids=lambda f: next(iter(f)),
)
def test_key_differs_by_any_sampling_param(fields: dict[str, Any]) -> None:
    assert key(changed(**fields)) != key(BODY)


def test_key_differs_by_adding_a_param_that_was_absent() -> None:
    body = copy.deepcopy(BODY)
    del body["top_p"]
    assert key(body) != key(BODY)


def test_key_differs_by_tools() -> None:
    other = copy.deepcopy(BODY)
    other["tools"][0]["function"]["parameters"]["properties"]["x"]["type"] = "string"
    assert key(other) != key(BODY)
    assert key(changed(tools=[])) != key(BODY)
    no_tools = copy.deepcopy(BODY)
    del no_tools["tools"]
    assert key(no_tools) != key(BODY)


def test_key_differs_by_response_format() -> None:
    assert key(changed(response_format={"type": "text"})) != key(BODY)
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    schema2 = copy.deepcopy(schema)
    schema2["json_schema"]["name"] = "b"
    assert key(changed(response_format=schema)) != key(changed(response_format=schema2))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b["messages"][1].__setitem__("content", "What is 2+3?"),
        lambda b: b["messages"][1].__setitem__("content", "What is 2+2? "),
        lambda b: b["messages"][0].__setitem__("content", "be verbose"),
        lambda b: b["messages"][0].__setitem__("role", "developer"),
        lambda b: b["messages"].reverse(),
        lambda b: b["messages"].append({"role": "assistant", "content": "4"}),
        lambda b: b["messages"].pop(0),
        lambda b: b["messages"][1].__setitem__("content", [{"type": "text", "text": "What is 2+2?"}]),
        lambda b: b["messages"][1].__setitem__("name", "alice"),
    ],
)
def test_key_differs_by_message_content(mutate: Any) -> None:
    body = copy.deepcopy(BODY)
    mutate(body)
    assert key(body) != key(BODY)


def test_key_equal_for_reordered_json_keys_at_every_level() -> None:
    def reverse_keys(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: reverse_keys(node[k]) for k in reversed(list(node))}
        if isinstance(node, list):
            return [reverse_keys(v) for v in node]
        return node

    reordered = reverse_keys(BODY)
    assert list(reordered) != list(BODY)
    assert list(reordered["tools"][0]["function"]) != list(BODY["tools"][0]["function"])
    assert key(reordered) == key(BODY)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"temperature": 1}, {"temperature": 1.0}),
        ({"top_p": 1}, {"top_p": 1.0}),
        ({"presence_penalty": 0}, {"presence_penalty": 0.0}),
        ({"frequency_penalty": 2}, {"frequency_penalty": 2.0}),
    ],
)
def test_key_equal_for_int_and_float_sampling_params(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(changed(**a)) == key(changed(**b))


def test_key_does_not_mistake_bool_for_number() -> None:
    assert key(changed(temperature=True)) != key(changed(temperature=1.0))


@pytest.mark.parametrize(
    "fields",
    [
        {"stream": True},
        {"stream": False},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"user": "alice"},
        {"user": "bob"},
        {"metadata": {"trace": "123"}},
        {"store": True},
        {"service_tier": "auto"},
    ],
)
def test_key_ignores_transport_and_bookkeeping_fields(fields: dict[str, Any]) -> None:
    assert key(changed(**fields)) == key(BODY)


def test_key_does_not_mutate_the_body() -> None:
    body = changed(temperature=0, stream=True, user="u")
    snapshot = copy.deepcopy(body)
    key(body)
    assert body == snapshot
    assert isinstance(body["temperature"], int)


# ----------------------------------------------------------------------------- is_deterministic
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0}, True),
        ({"temperature": -0.0}, True),
        ({"temperature": 0.7, "seed": 42}, True),
        ({"seed": 0}, True),
        ({"temperature": 0, "seed": None}, True),
        ({}, False),  # the upstream default temperature is 1
        ({"temperature": None}, False),
        ({"temperature": 0.01}, False),
        ({"temperature": 1}, False),
        ({"temperature": "0"}, False),
        ({"temperature": False}, False),
        ({"seed": None}, False),
        ({"top_p": 0}, False),
    ],
)
def test_is_deterministic(body: dict[str, Any], expected: bool) -> None:
    assert is_deterministic(body) is expected
