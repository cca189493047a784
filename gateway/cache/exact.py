"""Exact-match response cache: an in-process LRU bounded in bytes, or Redis.

Values are opaque bytes (the serialised response). A Redis problem never fails a request:
it degrades to a miss, is counted, and Redis is skipped for a short cool-down."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

# What one entry costs beyond its key's and value's own objects: the (expiry, value) tuple,
# the expiry float and the ordered dict's slot and link (CPython 3.11, measured with
# tracemalloc: tests/test_memory_cache.py holds the accounting to the real figure).
ENTRY_OVERHEAD: Final = 160


def entry_cost(key: str, value: bytes) -> int:
    """The Python memory one entry holds, as ``max_bytes`` counts it."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY_OVERHEAD


class MemoryCache:
    """LRU over (expiry, bytes); evicts least recently used entries past ``max_bytes``, counted
    as the memory the entries really hold (``entry_cost``), not just their payload."""

    backend = "memory"

    def __init__(self, max_bytes: int, max_entry_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._max_entry = max_entry_bytes
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    async def get(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            self._drop(key)
            return None
        self._data.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self.set_nowait(key, value, ttl)

    def set_nowait(self, key: str, value: bytes, ttl: float) -> bool:
        cost = entry_cost(key, value)
        if key in self._data:
            self._drop(key)  # even when the new value is not kept: never serve the older one
        if cost > self._max_entry:
            return True
        self._data[key] = (time.monotonic() + ttl, value)
        self._bytes += cost
        while self._bytes > self._max_bytes and self._data:
            self._drop(next(iter(self._data)))
        return True

    def _drop(self, key: str) -> None:
        _, value = self._data.pop(key)
        self._bytes -= entry_cost(key, value)

    async def ping(self) -> bool:
        return True

    def held_bytes(self) -> int | None:
        return self._bytes

    async def aclose(self) -> None:
        self._data.clear()
        self._bytes = 0


class RedisCache:
    backend = "redis"
    PREFIX = "switchyard:exact:"
    SLOW_IN_A_ROW = 3

    def __init__(
        self,
        url: str,
        timeout: float,
        max_entry_bytes: int,
        cooldown: float = 1.0,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._on_error = on_error
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, health_check_interval=0
        )
        self._timeout = timeout
        self._max_entry = max_entry_bytes
        self._cooldown = cooldown
        self._down_until = 0.0
        self._slow = 0  # timeouts in a row
        self.errors = 0

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        """Count a failure and rest ``cooldown`` seconds, except after a lone timeout: on a
        loaded replica a late answer is the event loop's delay as often as Redis', so the
        next lookups still try (``SLOW_IN_A_ROW`` timeouts in a row rest, as an error does)."""
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        if isinstance(exc, (TimeoutError, RedisTimeout)):  # ours, or the client's socket timeout
            self._slow += 1
            if self._slow < self.SLOW_IN_A_ROW:
                return
        self._slow = 0
        self._down_until = time.monotonic() + self._cooldown

    async def get(self, key: str) -> bytes | None:
        if not self._available():
            return None
        try:
            async with asyncio.timeout(self._timeout):
                value = await self._client.get(self.PREFIX + key)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return None
        self._slow = 0
        return value if isinstance(value, bytes) else None

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        if not self._available():
            return
        try:
            async with asyncio.timeout(self._timeout):
                if len(value) > self._max_entry:  # not kept; nor is an older value for this key
                    await self._client.delete(self.PREFIX + key)
                    return
                await self._client.set(self.PREFIX + key, value, px=max(1, int(ttl * 1000)))
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)

    def held_bytes(self) -> int | None:
        return None  # the entries live in Redis

    def set_nowait(self, key: str, value: bytes, ttl: float) -> bool:
        return False  # a network round trip: awaited in the background (``set``)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(max(self._timeout, 0.5)):
                return bool(await self._client.ping())
        except (RedisError, OSError, TimeoutError):
            return False

    async def aclose(self) -> None:
        await self._client.aclose()
