"""Conversation stickiness shared through Redis: a conversation the load balancer moves to
another replica keeps its model there too (and so the provider's prompt cache).

One string per conversation, ``{prefix}{conversation key}`` -> model, expiring ``ttl_s`` after
its last use. A conversation request reads it (and pushes the expiry back) and writes it only
when the model that served differs from the one read (a new conversation, or a fallback that
now keeps it). Both ride on the limits' scripts when the request sends them (core/carry.py:
the admission script reads, the settlement script writes): then stickiness costs no round
trip of its own. Else the read is one ``GETEX`` and the write one ``SET`` in the background; a
request that is not a conversation costs nothing. Redis failing (or slow past ``timeout_s``)
is counted through ``on_error`` and the replica falls back to what it learnt itself
(``StickyConversations``), never a failed request; after a failure it leaves Redis alone for
``COOLDOWN_S`` (an outage costs each request no timeout), and says so in the log at most once
a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from gateway.core.carry import SharedRead, SharedWrite
from gateway.core.ports import Spawn, TaskHandle
from gateway.routing.sticky import StickyConversations

log = logging.getLogger("switchyard")
COOLDOWN_S: Final = 1.0
_LOG_EVERY_S: Final = 60.0


class RedisSticky:
    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        ttl_s: float = 3600.0,
        timeout_s: float = 0.25,
        spawn: Spawn,
        on_error: Callable[[], None] | None = None,
        local: StickyConversations | None = None,
    ) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.prefix = prefix
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.local = local if local is not None else StickyConversations(ttl_s=ttl_s)
        self.errors = 0
        self._spawn = spawn
        self._on_error = on_error
        self._tasks: set[TaskHandle] = set()
        self._down_until = 0.0
        self._logged = -_LOG_EVERY_S
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )

    def __len__(self) -> int:
        return len(self.local)

    def peek(self, key: str) -> SharedRead | None:
        if time.monotonic() < self._down_until:
            return None  # resting after a failure: the local memory answers
        return SharedRead(self.url, self.prefix + key, self.ttl_ms)

    async def recall(self, key: str, peeked: SharedRead | None = None) -> str | None:
        if peeked is not None and peeked.done:
            return peeked.value  # a carrier (the limits' admission script) read it
        if time.monotonic() < self._down_until:
            return self.local.model(key)
        try:
            model = await self._client.getex(self.prefix + key, px=self.ttl_ms)
        except Exception as exc:  # the redis client's errors, OSError, timeouts
            self._failed("read", exc)
            return self.local.model(key)
        return None if model is None else str(model)

    def remember(self, key: str, model: str, recalled: str | None) -> SharedWrite | None:
        self.local.remember(key, model)  # what this replica falls back on while Redis is away
        if model == recalled or time.monotonic() < self._down_until:
            return None
        return SharedWrite(self.url, self.prefix + key, model, self.ttl_ms)

    def write(self, put: SharedWrite) -> None:
        self._tasks = {t for t in self._tasks if not t.done()}
        self._tasks.add(self._spawn(self._set(put)))

    async def _set(self, put: SharedWrite) -> None:
        try:
            await self._client.set(put.key, put.value, px=put.ttl_ms)
        except Exception as exc:
            self._failed("write", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        self.errors += 1
        now = time.monotonic()
        self._down_until = now + COOLDOWN_S
        if self._on_error is not None:
            self._on_error()
        if now - self._logged >= _LOG_EVERY_S:
            self._logged = now
            log.warning("stickiness: redis %s failed (%s); local memory serves", what, type(exc).__name__)

    async def aclose(self) -> None:
        import asyncio

        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()
