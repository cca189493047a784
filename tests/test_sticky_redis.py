"""Conversation stickiness shared through a real Redis (gateway/routing/sticky_redis.py): what
one replica learnt, another uses; entries expire; a Redis outage falls back to what the
replica learnt itself and is counted, never raised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

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
        one.remember("conv", "small", None)  # a fallback served it on replica one
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
        dead.remember("conv", "small", None)  # Redis resting after the failure: not tried
        await tasks.aclose()
        assert await dead.recall("conv") == "small"  # its own memory, at once
        assert time.monotonic() - started < 1.0
        assert dead.errors == 1 and counted == [1]
        await asyncio.sleep(COOLDOWN_S)
        assert await dead.recall("conv") == "small"  # tried again, failed again, still served
        assert dead.errors == 2
    finally:
        await dead.aclose()
