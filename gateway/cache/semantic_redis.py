"""Semantic-cache entries shared through Redis, so replicas answer each other's repeats.

Layout under ``prefix`` (default ``switchyard:semcache:``):

- ``{prefix}e:{uid}``: a hash per entry (c = context id, t = question, v = fp16 vector,
  p = packed payload, x = expiry wall time), expiring with the entry's TTL;
- ``{prefix}stream``: a stream announcing each new uid (capped near ``max_entries``).

A replica rebuilds its index on start (SCAN of the entry hashes) and then follows the
stream for other replicas' new entries. The lookup path never touches Redis: a Redis
outage only means entries are not shared (and are counted as errors), never a failed request."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.cache.semantic import Entry, SemanticCache, Vector
from gateway.cache.semantic_index import DIM
from gateway.core.ports import Spawn, TaskHandle

log = logging.getLogger("switchyard.semcache")
FOLLOW_BLOCK_MS = 1000


def _entry_of(uid: str, fields: dict[bytes, bytes]) -> tuple[Entry, Vector] | None:
    try:
        vec = np.frombuffer(fields[b"v"], dtype=np.float16).astype(np.float32)
        if vec.shape != (DIM,):
            return None
        entry = Entry(uid, fields[b"c"].decode(), fields[b"t"].decode(), fields[b"p"], float(fields[b"x"]))
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    return entry, vec


class RedisSemanticStore:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "switchyard:semcache:",
        timeout_s: float = 0.5,
        max_entries: int = 100_000,
        on_error: Callable[[], None] | None = None,
        spawn: Spawn,
    ) -> None:
        self.prefix = prefix
        self._spawn = spawn
        self.replica = uuid.uuid4().hex[:12]
        self.max_entries = max_entries
        self._redis: Any = aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        # The follower's blocking XREAD waits up to FOLLOW_BLOCK_MS for news by design: its
        # connection's read timeout is that wait plus the ordinary one, so a quiet healthy
        # Redis is never an error; a Redis that does not answer still is.
        self._follow_redis: Any = aioredis.from_url(
            url, socket_timeout=FOLLOW_BLOCK_MS / 1000 + timeout_s, socket_connect_timeout=timeout_s
        )
        self._on_error = on_error
        self._tasks: set[TaskHandle] = set()  # writes in flight
        self._follower: TaskHandle | None = None
        self.errors = 0
        self.loaded = 0
        self.followed = 0

    @property
    def stream(self) -> str:
        return f"{self.prefix}stream"

    def _key(self, uid: str) -> str:
        return f"{self.prefix}e:{uid}"

    def _error(self, what: str, exc: Exception) -> None:
        self.errors += 1
        if self._on_error is not None:
            self._on_error()
        log.warning("semantic cache: redis %s failed: %s", what, type(exc).__name__)

    # ------------------------------------------------------------------ write
    def put(self, entry: Entry, vector: Vector, ttl: float) -> None:
        self._tasks = {t for t in self._tasks if not t.done()}
        self._tasks.add(self._spawn(self._put(entry, vector, ttl)))

    async def _put(self, entry: Entry, vector: Vector, ttl: float) -> None:
        fields = {
            "c": entry.context, "t": entry.text, "p": entry.payload, "x": repr(entry.expires),
            "v": np.asarray(vector, dtype=np.float16).tobytes(),
        }  # fmt: skip
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(self._key(entry.uid), mapping=fields)
                pipe.pexpire(self._key(entry.uid), max(1, int(ttl * 1000)))
                pipe.xadd(
                    self.stream,
                    {"u": entry.uid, "o": self.replica},
                    maxlen=self.max_entries,
                    approximate=True,
                )
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._error("write", exc)

    # ------------------------------------------------------------------ read
    async def _fetch(self, uids: list[str]) -> list[tuple[Entry, Vector]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for uid in uids:
                pipe.hgetall(self._key(uid))
            rows = await pipe.execute()
        out = []
        for uid, fields in zip(uids, rows, strict=True):
            item = _entry_of(uid, fields) if fields else None
            if item is not None:
                out.append(item)
        return out

    async def load(self, cache: SemanticCache, batch: int = 1000) -> int:
        """Add every live entry in Redis to ``cache``; returns how many were added."""
        added, cursor, head = 0, 0, f"{self.prefix}e:"
        try:
            while True:
                cursor, keys = await self._redis.scan(cursor, match=f"{head}*", count=batch)
                uids = [k.decode()[len(head) :] for k in keys]
                items = await self._fetch(uids) if uids else []
                if items:
                    added += cache.add_many([e for e, _ in items], np.stack([v for _, v in items]))
                if cursor == 0:
                    break
        except (RedisError, OSError) as exc:
            self._error("load", exc)
        self.loaded += added
        return added

    async def start(self, cache: SemanticCache) -> int:
        """Attach to ``cache``: rebuild it from Redis, then follow other replicas' entries."""
        cache.sink = self
        last = "0-0"
        try:
            newest = await self._redis.xrevrange(self.stream, count=1)
            if newest:
                last = newest[0][0].decode()
        except (RedisError, OSError) as exc:
            self._error("stream", exc)
        added = await self.load(cache)
        self._follower = self._spawn(self._follow(cache, last))
        return added

    async def _follow(self, cache: SemanticCache, last: str) -> None:
        while True:
            try:
                reply = await self._follow_redis.xread({self.stream: last}, count=500, block=FOLLOW_BLOCK_MS)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self._error("follow", exc)
                await asyncio.sleep(1.0)
                continue
            for _, messages in reply or []:
                last = messages[-1][0].decode()
                uids = [f[b"u"].decode() for _, f in messages if f.get(b"o", b"").decode() != self.replica]
                if not uids:
                    continue
                try:
                    items = await self._fetch(uids)
                except (RedisError, OSError) as exc:
                    self._error("fetch", exc)
                    continue
                for entry, vec in items:
                    if cache.add_entry(entry, vec):
                        self.followed += 1

    async def aclose(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()
        await self._follow_redis.aclose()
