"""The exact cache on a real Redis: the backend itself, sharing across gateway instances, and
an outage that must degrade to misses (never to failed or slow requests)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
import redis

from gateway.cache.exact import RedisCache
from gateway.cache.keys import canonical_key
from load_tests.mock_upstream import MockUpstream
from tests.conftest import service_unavailable
from tests.gateway_harness import mock_policy, start_gateway

pytestmark = pytest.mark.redis

REDIS_URL = "redis://127.0.0.1:6379/0"
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"
PREFIX = RedisCache.PREFIX


@pytest.fixture(scope="module")
def redis_server() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        client.close()
        service_unavailable("Redis at 127.0.0.1:6379", f"{type(exc).__name__}: {exc}")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def our_keys(redis_server: redis.Redis) -> Iterator[list[str]]:
    """Full Redis keys this test created; deleted afterwards (never a FLUSHALL)."""
    keys: list[str] = []
    yield keys
    if keys:
        redis_server.delete(*keys)


def unique(tag: str) -> str:
    return f"sy-test-{tag}-{uuid.uuid4().hex}"


@pytest.fixture
async def cache(redis_server: redis.Redis) -> AsyncIterator[RedisCache]:
    c = RedisCache(REDIS_URL, timeout=1.0, max_entry_bytes=1024)
    try:
        yield c
    finally:
        await c.aclose()


# ----------------------------------------------------------------------------- the backend
async def test_get_set_roundtrip(cache: RedisCache, redis_server: redis.Redis, our_keys: list[str]) -> None:
    key = unique("roundtrip")
    our_keys.append(PREFIX + key)
    assert await cache.get(key) is None
    await cache.set(key, b'{"answer": 42}', ttl=60)
    assert await cache.get(key) == b'{"answer": 42}'
    assert redis_server.get(PREFIX + key) == b'{"answer": 42}'  # stored under the documented prefix
    ttl_ms = redis_server.pttl(PREFIX + key)
    assert 55_000 < ttl_ms <= 60_000
    await cache.set(key, b"second", ttl=60)
    assert await cache.get(key) == b"second"
    assert cache.errors == 0
    assert await cache.ping() is True


async def test_binary_values_roundtrip(cache: RedisCache, our_keys: list[str]) -> None:
    key = unique("binary")
    our_keys.append(PREFIX + key)
    value = bytes(range(256))
    await cache.set(key, value, ttl=60)
    assert await cache.get(key) == value


async def test_ttl_expiry(cache: RedisCache, redis_server: redis.Redis, our_keys: list[str]) -> None:
    key = unique("ttl")
    our_keys.append(PREFIX + key)
    await cache.set(key, b"short-lived", ttl=0.3)
    assert await cache.get(key) == b"short-lived"
    assert 0 < redis_server.pttl(PREFIX + key) <= 300
    await asyncio.sleep(0.5)
    assert await cache.get(key) is None
    assert redis_server.exists(PREFIX + key) == 0


async def test_tiny_ttl_still_sets_an_expiry(cache: RedisCache, our_keys: list[str]) -> None:
    key = unique("tiny-ttl")
    our_keys.append(PREFIX + key)
    await cache.set(key, b"x", ttl=0.0001)  # rounds up to 1 ms, never "no expiry"
    await asyncio.sleep(0.05)
    assert await cache.get(key) is None


async def test_large_entries_are_skipped(
    cache: RedisCache, redis_server: redis.Redis, our_keys: list[str]
) -> None:
    key = unique("large")
    our_keys.append(PREFIX + key)
    await cache.set(key, b"x" * 1025, ttl=60)  # max_entry_bytes=1024
    assert redis_server.exists(PREFIX + key) == 0
    assert await cache.get(key) is None
    await cache.set(key, b"x" * 1024, ttl=60)  # exactly at the limit is kept
    assert await cache.get(key) == b"x" * 1024
    assert cache.errors == 0


async def test_oversized_overwrite_does_not_leave_a_stale_entry(
    cache: RedisCache, redis_server: redis.Redis, our_keys: list[str]
) -> None:
    key = unique("stale")
    our_keys.append(PREFIX + key)
    await cache.set(key, b"old answer", ttl=60)
    await cache.set(key, b"y" * 2048, ttl=60)  # a newer answer too large to keep
    assert await cache.get(key) is None
    assert redis_server.exists(PREFIX + key) == 0


async def test_dead_redis_degrades_to_misses_and_counts_errors() -> None:
    c = RedisCache(DEAD_REDIS_URL, timeout=0.05, max_entry_bytes=1024, cooldown=0.3)
    try:
        t0 = time.perf_counter()
        assert await c.get("k") is None
        assert c.errors == 1
        await c.set("k", b"v", ttl=10)  # in the cool-down: not even tried
        assert await c.get("k") is None
        assert c.errors == 1
        await asyncio.sleep(0.35)
        await c.set("k", b"v", ttl=10)  # after the cool-down: tried again, fails again
        assert c.errors == 2
        assert await c.ping() is False
        assert time.perf_counter() - t0 < 2.0
    finally:
        await c.aclose()


async def test_unresponsive_redis_times_out_fast() -> None:
    """A server that accepts connections and never answers: bounded by the timeout."""
    hung: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)
        await reader.read(1 << 16)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = RedisCache(f"redis://127.0.0.1:{port}/0", timeout=0.1, max_entry_bytes=1024, cooldown=30)
    try:
        t0 = time.perf_counter()
        assert await c.get("k") is None
        assert time.perf_counter() - t0 < 1.0
        assert c.errors == 1
        # a lone timeout is not an outage (a loaded loop answers late too): the next lookups
        # still ask; a few in a row rest the cache like an error
        for n in range(2, RedisCache.SLOW_IN_A_ROW + 1):
            assert await c.get("k") is None
            assert c.errors == n
        assert await c.get("k") is None
        assert c.errors == RedisCache.SLOW_IN_A_ROW  # resting: not tried
        assert time.perf_counter() - t0 < 2.0
    finally:
        await c.aclose()
        for w in hung:
            w.close()
        server.close()
        await server.wait_closed()


# ----------------------------------------------------------------------------- gateways
REDIS_POLICY = f"cache: {{backend: redis, redis_url: '{REDIS_URL}'}}\n"
DEAD_POLICY = f"cache: {{backend: redis, redis_url: '{DEAD_REDIS_URL}', redis_timeout_s: 0.05}}\n"


def chat_body(content: str) -> dict[str, object]:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": content}]}


def test_two_gateways_share_the_redis_cache(
    tmp_path: Path, mock: MockUpstream, redis_server: redis.Redis, our_keys: list[str]
) -> None:
    content = unique("shared")
    body = chat_body(content)
    our_keys.append(PREFIX + canonical_key("team-a", "auto", "chat", body))
    gw1 = start_gateway(tmp_path / "one", mock_policy(mock.base_url, extra=REDIS_POLICY))
    gw2 = start_gateway(tmp_path / "two", mock_policy(mock.base_url, extra=REDIS_POLICY))
    try:
        assert gw1.app_state.services.cache.backend == "redis"
        # the same tenant name in both gateways: keys are per tenant, not per key id
        r1 = gw1.post("/v1/chat/completions", body)
        assert r1.status_code == 200, r1.text
        assert r1.headers["x-switchyard-cache"] == "miss"

        # the write is in the background: wait (bounded) until Redis has it
        deadline = time.monotonic() + 5
        while not redis_server.exists(our_keys[0]):
            assert time.monotonic() < deadline, "the first answer never reached Redis"
            time.sleep(0.02)

        r2 = gw2.post("/v1/chat/completions", body)
        assert r2.status_code == 200, r2.text
        assert r2.headers["x-switchyard-cache"] == "hit"
        assert r2.json() == r1.json()
        chats = [r for r in mock.requests() if r["path"].endswith("/chat/completions")]
        assert len(chats) == 1, chats

        # another tenant does not share it
        r3 = gw2.post("/v1/chat/completions", body, tenant="team-c")
        our_keys.append(PREFIX + canonical_key("team-c", "auto", "chat", body))
        assert r3.headers["x-switchyard-cache"] == "miss"

        rows = gw2.ledger_rows()
        hit = [row for row in rows if row["cache_status"] == "hit"]
        assert len(hit) == 1 and hit[0]["served_model"] is None and float(hit[0]["cost_usd"]) == 0.0
    finally:
        gw1.stop()
        gw2.stop()


def test_redis_down_degrades_to_misses(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra=DEAD_POLICY))
    try:
        assert gw.app_state.services.cache.backend == "redis"
        body = chat_body(unique("outage"))
        for i in range(6):
            t0 = time.perf_counter()
            r = gw.post("/v1/chat/completions", body)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200, (i, r.text)
            assert r.headers["x-switchyard-cache"] == "miss", i
            assert elapsed < 0.5, f"request {i} took {elapsed:.3f} s with Redis down"
        chats = [r for r in mock.requests() if r["path"].endswith("/chat/completions")]
        assert len(chats) == 6  # nothing was served from anywhere but the upstream

        # streaming too
        with httpx.Client(timeout=10) as client:
            s = client.post(
                gw.url + "/v1/chat/completions", json={**body, "stream": True}, headers=gw.headers()
            )
        assert s.status_code == 200
        assert s.headers["x-switchyard-cache"] == "miss"
        assert s.text.rstrip().endswith("data: [DONE]")

        ready = gw.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {
            "status": "not_ready",
            "checks": {"policy": True, "ledger": True, "models": True, "redis": False},
        }
        assert gw.get("/healthz").status_code == 200  # alive, only not ready

        metrics = gw.get("/metrics").text
        assert _metric(metrics, "switchyard_cache_results_total", result="miss") == 7.0
        errors = gw.app_state.services.cache.errors
        assert errors >= 1
        assert _metric(metrics, "switchyard_cache_backend_errors_total", backend="redis") == float(errors)
    finally:
        gw.stop()


def test_redis_outage_is_counted_in_metrics(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra=DEAD_POLICY))
    try:
        metrics = gw.get("/metrics").text
        assert _metric(metrics, "switchyard_cache_backend_errors_total", backend="redis") in (None, 0.0)
        r = gw.post("/v1/chat/completions", chat_body(unique("outage-metric")))
        assert r.status_code == 200
        assert r.headers["x-switchyard-cache"] == "miss"
        cache = gw.app_state.services.cache
        assert cache.errors == 1  # the lookup failed; the store was skipped in the cool-down
        value = _metric(gw.get("/metrics").text, "switchyard_cache_backend_errors_total", backend="redis")
        assert value == 1.0
    finally:
        gw.stop()


def test_readyz_with_a_live_redis(tmp_path: Path, mock: MockUpstream, redis_server: redis.Redis) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra=REDIS_POLICY))
    try:
        ready = gw.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {"policy": True, "ledger": True, "models": True, "redis": True}
    finally:
        gw.stop()


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for line in text.splitlines():
        m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
        if m and m.group(1) == name and set(filter(None, (m.group(2) or "").split(","))) == want:
            return float(m.group(3))
    return None


def test_env_redis_url_overrides_the_policy_backend(
    tmp_path: Path, mock: MockUpstream, redis_server: redis.Redis
) -> None:
    """SWITCHYARD_REDIS_URL (Settings.redis_url) puts the exact cache in Redis even when the
    policy says memory: replicas of one deployment share it without editing the policy."""
    gw = start_gateway(tmp_path, mock_policy(mock.base_url), redis_url=REDIS_URL)
    try:
        assert gw.app_state.services.cache.backend == "redis"
        r = gw.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"]["redis"] is True
    finally:
        gw.stop()
