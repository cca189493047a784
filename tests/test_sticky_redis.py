"""Conversation stickiness shared through a real Redis (gateway/routing/sticky_redis.py): what
one replica learnt, another uses; entries expire; a Redis outage falls back to what the
replica learnt itself and is counted, never raised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from gateway.flow.services import TaskOwner
from gateway.routing.sticky_redis import COOLDOWN_S, RedisSticky
from tests.limits_helpers import REDIS_URL, redis_prefix


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix("sytest-sticky") as p:
        yield p


@pytest.mark.redis
async def test_what_one_replica_learnt_another_uses_until_it_expires(prefix: str) -> None:
    tasks = TaskOwner()
    one = RedisSticky(REDIS_URL, prefix=prefix, ttl_s=0.6, spawn=tasks.spawn)
    two = RedisSticky(REDIS_URL, prefix=prefix, ttl_s=0.6, spawn=tasks.spawn)
    try:
        assert await two.recall("conv") is None
        put = one.remember("conv", "small", None)  # a fallback served it on replica one
        assert put is not None and one.remember("conv", "small", "small") is None  # no change
        one.write(put)  # nothing carried it: the store writes it itself
        await tasks.aclose()  # the background SET has landed
        assert await two.recall("conv") == "small"
        for _ in range(3):  # each read pushes the expiry back: a live conversation stays
            await asyncio.sleep(0.3)
            assert await two.recall("conv") == "small"
        await asyncio.sleep(0.8)
        assert await two.recall("conv") is None  # idle past the TTL: forgotten
        assert one.errors == two.errors == 0
    finally:
        await one.aclose()
        await two.aclose()


async def test_an_unreachable_redis_falls_back_to_this_replica_and_counts() -> None:
    tasks = TaskOwner()
    counted: list[int] = []
    dead = RedisSticky(
        "redis://127.0.0.1:1/0",
        prefix="x:",
        timeout_s=0.2,
        spawn=tasks.spawn,
        on_error=lambda: counted.append(1),
    )
    try:
        started = time.monotonic()
        assert await dead.recall("conv") is None
        assert dead.remember("conv", "small", None) is None  # Redis resting: nothing to write
        assert dead.peek("conv") is None  # nor to read
        await tasks.aclose()
        assert await dead.recall("conv") == "small"  # its own memory, at once
        assert time.monotonic() - started < 1.0
        assert dead.errors == 1 and counted == [1]
        await asyncio.sleep(COOLDOWN_S)
        assert await dead.recall("conv") == "small"  # tried again, failed again, still served
        assert dead.errors == 2
    finally:
        await dead.aclose()


@pytest.mark.redis
async def test_the_limits_scripts_carry_the_read_and_the_write(prefix: str) -> None:
    """The admission script reads a conversation's model (and pushes its expiry back), the
    settlement script writes it: what RedisSticky asks for, on the limits' own round trips; a
    read or write on another Redis is not carried (its owner makes it)."""
    from gateway.core.carry import SharedRead
    from gateway.limits.ratelimit import BucketCheck
    from gateway.limits.redis_store import RedisStore

    tasks = TaskOwner()
    sticky = RedisSticky(REDIS_URL, prefix=prefix + "sticky:", ttl_s=60, spawn=tasks.spawn)
    store = RedisStore(REDIS_URL, prefix, timeout_s=2)
    bucket = (BucketCheck("b", 100, 1.0, "take", "rpm"),)
    try:
        peek = sticky.peek("conv")
        assert peek is not None
        assert (await store.admit(bucket, [], peek))[0] is None
        assert peek.done and peek.value is None and await sticky.recall("conv", peek) is None
        put = sticky.remember("conv", "small", None)
        assert put is not None and store.carries(put)
        await store.finish(bucket, [], 0, put)
        again = sticky.peek("conv")
        assert again is not None
        await store.admit(bucket, [], again)
        assert again.done and await sticky.recall("conv", again) == "small"
        elsewhere = SharedRead("redis://127.0.0.1:6379/15", again.key, 1000)
        await store.admit(bucket, [], elsewhere)
        assert not elsewhere.done  # another Redis: left to its owner
        assert not store.carries(replace(put, url="redis://127.0.0.1:6379/15"))
        assert sticky.errors == 0
    finally:
        await store.aclose()
        await sticky.aclose()
