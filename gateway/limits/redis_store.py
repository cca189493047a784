"""Rate-limit buckets and budget counters shared by several replicas through Redis.

Each operation is one atomic Lua script (one round trip): a request either passes every check
and is charged on every bucket/budget, or is refused and charges nothing. The bucket scripts
use Redis' own clock (``TIME``) so replicas with skewed clocks agree.

A request needs two: ``admit`` (every rate-limit bucket, then the worst-case reservation on
the first candidate route whose budgets all allow it; awaited) and ``finish`` (the
tokens-per-minute debit and the budget settlement together; off the response's path). Each
may carry one read or write of another part on the same Redis (core/carry.py: a
conversation's sticky model), which then costs no round trip of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from gateway.core.carry import SharedRead, SharedWrite
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

# One admission: ARGV = np (1: a carried read, then its ttl in ms; else 0), nb, (cap, cost,
# mode) x nb, nc, then per candidate: n, amount, (limit, ttl) x n; KEYS = the carried read's
# key (np = 1), the nb bucket keys, then each candidate's n counter keys. Returns {1, bucket,
# wait} when a bucket refuses (nothing charged), else (buckets charged) {0, chosen candidate or
# 0 when every one refused, the first candidate's refusing line, the carried read's value}.
_ADMIT_LUA: Final = """
local np = tonumber(ARGV[1])
local peeked = false
if np == 1 then
  peeked = redis.call('GET', KEYS[1])
  if peeked then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
local ko = np
local ao = 1 + np
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nb = tonumber(ARGV[ao + 1])
local after = {}
for i = 1, nb do
  local base = ao + 1 + (i - 1) * 3
  local cap = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local mode = ARGV[base + 3]
  local rate = cap / 60.0
  local v = redis.call('HMGET', KEYS[ko + i], 't', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil or ts == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  if mode == 'take' then
    if tokens < cost then return {1, i, tostring((cost - tokens) / rate)} end
    tokens = tokens - cost
  elseif mode == 'check' then
    if tokens < 1 then return {1, i, tostring((1 - tokens) / rate)} end
  else
    tokens = tokens - cost
  end
  after[i] = tokens
end
for i = 1, nb do
  local cap = tonumber(ARGV[ao + 1 + (i - 1) * 3 + 1])
  redis.call('HSET', KEYS[ko + i], 't', tostring(after[i]), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[ko + i], 120 + math.ceil(60 * math.max(1, -after[i]) / cap))
end
local a = ao + 2 + nb * 3
local nc = tonumber(ARGV[a])
a = a + 1
local k = ko + nb
local first = 0
for c = 1, nc do
  local n = tonumber(ARGV[a])
  local amount = tonumber(ARGV[a + 1])
  local refused = 0
  if amount > 0 then
    for j = 1, n do
      local spent = tonumber(redis.call('GET', KEYS[k + j]) or '0')
      if spent + amount > tonumber(ARGV[a + j * 2]) then refused = j; break end
    end
  end
  if refused == 0 then
    for j = 1, n do
      redis.call('INCRBY', KEYS[k + j], amount)
      redis.call('EXPIRE', KEYS[k + j], tonumber(ARGV[a + j * 2 + 1]))
    end
    return {0, c, first, peeked}
  end
  if first == 0 then first = refused end
  a = a + 2 + n * 2
  k = k + n
end
return {0, 0, first, peeked}
"""

# After the call: ARGV = np (1: a carried write, then its value and ttl in ms; else 0), nb,
# (cap, cost) x nb, delta; KEYS = the carried write's key (np = 1), nb token buckets (debited
# unconditionally), then the reservation's counters (moved by delta where they still exist).
_FINISH_LUA: Final = """
local np = tonumber(ARGV[1])
if np == 1 then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
local ko = np
local ao = 1 + np * 2
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nb = tonumber(ARGV[ao + 1])
for i = 1, nb do
  local cap = tonumber(ARGV[ao + i * 2])
  local cost = tonumber(ARGV[ao + i * 2 + 1])
  local v = redis.call('HMGET', KEYS[ko + i], 't', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil or ts == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * cap / 60.0) - cost
  redis.call('HSET', KEYS[ko + i], 't', tostring(tokens), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[ko + i], 120 + math.ceil(60 * math.max(1, -tokens) / cap))
end
local delta = ARGV[ao + nb * 2 + 2]
if tonumber(delta) ~= 0 then
  for i = ko + nb + 1, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], delta) end
  end
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
        self._admit = self._client.register_script(_ADMIT_LUA)
        self._finish = self._client.register_script(_FINISH_LUA)

    async def admit(
        self,
        checks: Sequence[BucketCheck],
        candidates: Sequence[tuple[Sequence[BudgetLine], int]],
        peek: SharedRead | None = None,
    ) -> tuple[tuple[int, float] | None, int | None, int | None]:
        """Every bucket, then a reservation of ``amount`` on all the lines of the first
        candidate (lines, amount) they allow, in one script. Returns (bucket refusal as in
        ``apply``: nothing charged; else None, the buckets charged), the index of the
        candidate reserved on (None: every one refused, or the buckets did), and the index of
        the line that refused the first candidate (None when it fit). ``peek``: a read carried
        in the same script (filled in, ``done``), when it is on this Redis."""
        now = time.time()
        carried = peek is not None and peek.url == self.url
        keys = [peek.key] if carried and peek is not None else []
        args: list[str | int | float] = [1, peek.ttl_ms] if carried and peek is not None else [0]
        keys += [self.prefix + "rl:" + c.key for c in checks]
        args.append(len(checks))
        for c in checks:
            args += [c.capacity, c.cost, c.mode]
        args.append(len(candidates))
        for lines, amount in candidates:
            args += [len(lines), amount]
            for line in lines:
                keys.append(self._key(line))
                args += [line.limit, int(line.ends_at - now) + _GRACE_S]
        reply = await self._admit(keys=keys, args=args)
        if int(reply[0]) == 1:
            return (int(reply[1]) - 1, float(reply[2])), None, None
        if carried and peek is not None:
            value = reply[3] if len(reply) > 3 else None
            peek.value, peek.done = (None if value is None else str(value)), True
        chosen, first = int(reply[1]), int(reply[2])
        return None, (chosen - 1 if chosen else None), (first - 1 if first else None)

    def carries(self, write: SharedWrite | None) -> bool:
        """``write`` can ride on ``finish`` (it is on this Redis)."""
        return write is not None and write.url == self.url

    async def finish(
        self,
        debits: Sequence[BucketCheck],
        lines: Sequence[BudgetLine],
        delta: int,
        put: SharedWrite | None = None,
    ) -> None:
        """Debit ``debits`` (token buckets, unconditionally) and move ``lines`` by ``delta``
        nanos, in one script: what a request leaves on the limits once it is over; ``put``: a
        write carried in the same script (on this Redis: see ``carries``)."""
        keys: list[str] = []
        args: list[str | int | float] = [0]
        if put is not None and self.carries(put):
            keys, args = [put.key], [1, put.value, put.ttl_ms]
        keys += [self.prefix + "rl:" + c.key for c in debits]
        args.append(len(debits))
        for c in debits:
            args += [c.capacity, c.cost]
        args.append(delta)
        keys += [self._key(ln) for ln in lines] if delta else []
        await self._finish(keys=keys, args=args)

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
