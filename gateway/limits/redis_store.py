"""Rate-limit buckets and budget counters shared by several replicas through Redis.

Each operation is one atomic Lua script (one round trip): a request either passes every check
and is charged on every bucket/budget, or is refused and charges nothing. The bucket script
uses Redis' own clock (``TIME``) so replicas with skewed clocks agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from gateway.limits.budgets import BudgetLine
from gateway.limits.ratelimit import BucketCheck

_BUCKETS_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local after = {}
for i, key in ipairs(KEYS) do
  local base = (i - 1) * 3
  local cap = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local mode = ARGV[base + 3]
  local rate = cap / 60.0
  local v = redis.call('HMGET', key, 't', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil or ts == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  if mode == 'take' then
    if tokens < cost then return {i, tostring((cost - tokens) / rate)} end
    tokens = tokens - cost
  elseif mode == 'check' then
    if tokens < 1 then return {i, tostring((1 - tokens) / rate)} end
  else
    tokens = tokens - cost
  end
  after[i] = tokens
end
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[(i - 1) * 3 + 1])
  redis.call('HSET', key, 't', tostring(after[i]), 'ts', tostring(now))
  redis.call('EXPIRE', key, 120 + math.ceil(60 * math.max(1, -after[i]) / cap))
end
return {0, '0'}
"""

_RESERVE_LUA: Final = """
local amount = tonumber(ARGV[1])
if amount > 0 then
  for i, key in ipairs(KEYS) do
    local spent = tonumber(redis.call('GET', key) or '0')
    if spent + amount > tonumber(ARGV[i * 2]) then return i end
  end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, amount)
  redis.call('EXPIRE', key, tonumber(ARGV[i * 2 + 1]))
end
return 0
"""

_ADJUST_LUA: Final = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('INCRBY', key, ARGV[1]) end
end
return 0
"""

_GRACE_S: Final = 86_400  # counters outlive their period by a day (late settlements land)


class RedisStore:
    """Buckets and budget counters in Redis under ``prefix``. Every method may raise the
    redis client's errors (connection, timeout); the caller decides fail-open/closed."""

    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.prefix = prefix
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
        )
        self._buckets = self._client.register_script(_BUCKETS_LUA)
        self._reserve = self._client.register_script(_RESERVE_LUA)
        self._adjust = self._client.register_script(_ADJUST_LUA)

    async def apply(self, checks: Sequence[BucketCheck]) -> tuple[int, float] | None:
        keys = [self.prefix + "rl:" + c.key for c in checks]
        args: list[str | int | float] = []
        for c in checks:
            args += [c.capacity, c.cost, c.mode]
        index, wait = await self._buckets(keys=keys, args=args)
        return None if int(index) == 0 else (int(index) - 1, float(wait))

    def _key(self, line: BudgetLine) -> str:
        return self.prefix + "budget:" + line.counter

    async def reserve(self, lines: Sequence[BudgetLine], amount: int) -> int | None:
        now = time.time()
        args: list[int] = [amount]
        for line in lines:
            args += [line.limit, int(line.ends_at - now) + _GRACE_S]
        index = int(await self._reserve(keys=[self._key(ln) for ln in lines], args=args))
        return None if index == 0 else index - 1

    async def adjust(self, lines: Sequence[BudgetLine], delta: int) -> None:
        await self._adjust(keys=[self._key(ln) for ln in lines], args=[delta])

    async def seed(self, line: BudgetLine, spent: int) -> None:
        """Set a counter from the ledger unless a replica already did (SET NX)."""
        ttl = int(line.ends_at - time.time()) + _GRACE_S
        await self._client.set(self._key(line), spent, nx=True, ex=max(1, ttl))

    async def spent(self, lines: Sequence[BudgetLine]) -> list[int]:
        if not lines:
            return []
        values = await self._client.mget([self._key(ln) for ln in lines])
        return [int(v) if v is not None else 0 for v in values]

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except Exception:
            return False

    async def aclose(self) -> None:
        await self._client.aclose()
