"""Semantic-cache entries in real Redis: persistence, rebuild by a second replica, live sharing,
and a Redis outage that only costs sharing (never a failed lookup)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.cache.semantic import SemanticCache
from gateway.cache.semantic_key import semantic_key
from gateway.cache.semantic_redis import RedisSemanticStore
from gateway.cache.verifier import load_verifier
from gateway.flow.services import TaskOwner
from tests.conftest import service_unavailable
from tests.semcache_support import embedder  # noqa: F401

TASKS = TaskOwner()  # the background writes and followers of the stores under test

REDIS_URL = "redis://127.0.0.1:6379/0"
pytestmark = pytest.mark.redis


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    client: Any = aioredis.from_url(REDIS_URL, socket_timeout=1)
    try:
        await client.ping()
    except Exception as exc:
        await client.aclose()
        service_unavailable("Redis", repr(exc))
    name = f"test-semcache-{uuid.uuid4().hex[:8]}:"
    yield name
    keys = [k async for k in client.scan_iter(match=f"{name}*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def key_of(text: str, tenant: str = "t1") -> Any:
    key = semantic_key(tenant, "auto", {"model": "auto", "messages": [{"role": "user", "content": text}]})
    assert key is not None
    return key


async def wait_for(cond: Any, timeout: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return bool(cond())


async def test_second_replica_rebuilds_and_follows(prefix: str, embedder: Any) -> None:  # noqa: F811
    verifier = load_verifier()
    one, two = SemanticCache(verifier), SemanticCache(verifier)
    store_one = RedisSemanticStore(REDIS_URL, prefix=prefix, spawn=TASKS.spawn)
    store_two = RedisSemanticStore(REDIS_URL, prefix=prefix, spawn=TASKS.spawn)
    try:
        assert await store_one.start(one) == 0
        k = key_of("How can I reset my password?")
        one.insert(k.context, k.text, embedder.encode([k.text])[0], b'{"a": "reset"}', 60)
        await asyncio.sleep(0.2)  # the write is a background task
        # a replica started later rebuilds its index from Redis
        assert await store_two.start(two) == 1
        q = key_of("How do I reset my password?")
        found = two.lookup(q.context, q.text, embedder.encode([q.text])[0], 0.9)
        assert found.hit and found.payload == b'{"a": "reset"}'
        # and picks up entries the first replica adds afterwards (stream)
        k2 = key_of("What is the boiling point of water at sea level?")
        one.insert(k2.context, k2.text, embedder.encode([k2.text])[0], b'{"a": "100 C"}', 60)
        assert await wait_for(lambda: len(two) == 2)
        q2 = key_of("what is the boiling point of water at sea level")
        assert two.lookup(q2.context, q2.text, embedder.encode([q2.text])[0]).payload == b'{"a": "100 C"}'
        # tenants stay apart in Redis too
        other = key_of("How can I reset my password?", tenant="t2")
        assert not two.lookup(other.context, other.text, embedder.encode([other.text])[0], 0.0001).hit
        assert store_one.errors == store_two.errors == 0
    finally:
        await store_one.aclose()
        await store_two.aclose()
        one.close()
        two.close()


async def test_entries_expire_in_redis(prefix: str, embedder: Any) -> None:  # noqa: F811
    cache = SemanticCache(load_verifier())
    store = RedisSemanticStore(REDIS_URL, prefix=prefix, spawn=TASKS.spawn)
    try:
        await store.start(cache)
        k = key_of("How can I reset my password?")
        cache.insert(k.context, k.text, embedder.encode([k.text])[0], b"x", 0.3)
        await asyncio.sleep(0.6)
        late, reader = (
            SemanticCache(load_verifier()),
            RedisSemanticStore(REDIS_URL, prefix=prefix, spawn=TASKS.spawn),
        )
        try:
            assert await reader.load(late) == 0
        finally:
            await reader.aclose()
            late.close()
    finally:
        await store.aclose()
        cache.close()


async def test_redis_down_degrades_to_local_cache(embedder: Any) -> None:  # noqa: F811
    errors: list[int] = []
    cache = SemanticCache(load_verifier())
    store = RedisSemanticStore(
        "redis://127.0.0.1:1/0", timeout_s=0.2, on_error=lambda: errors.append(1), spawn=TASKS.spawn
    )
    try:
        assert await store.start(cache) == 0  # nothing to rebuild from; no exception
        k = key_of("How can I reset my password?")
        cache.insert(k.context, k.text, embedder.encode([k.text])[0], b"local", 60)
        q = key_of("How do I reset my password?")
        assert cache.lookup(q.context, q.text, embedder.encode([q.text])[0]).payload == b"local"
        assert await wait_for(lambda: store.errors >= 2)  # rebuild + write failures, counted
        assert errors
    finally:
        await store.aclose()
        cache.close()


async def test_a_quiet_healthy_redis_is_no_error(prefix: str) -> None:
    """The follower's blocking read waits a second for news; nothing arriving is not a
    failure (it counted a TimeoutError every second before)."""
    errors: list[int] = []
    cache = SemanticCache(load_verifier())
    store = RedisSemanticStore(REDIS_URL, prefix=prefix, on_error=lambda: errors.append(1), spawn=TASKS.spawn)
    try:
        await store.start(cache)
        await asyncio.sleep(2.6)  # two and a half blocking reads with nothing to read
        assert store.errors == 0 and errors == []
    finally:
        await store.aclose()
        cache.close()
