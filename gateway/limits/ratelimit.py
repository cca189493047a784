"""Rate limits as token buckets: requests per minute (tenant, key) and tokens per minute (key).

One request checks several buckets at once (``BucketCheck``): either all of them admit it or
none is charged. ``MemoryBuckets`` keeps them in this process; ``gateway.limits.redis_store``
runs the same algorithm as one atomic Lua script in Redis for several replicas.

A check has a mode: ``take`` debits ``cost`` when the bucket holds that much (rpm: cost 1);
``check`` only requires the bucket to be positive (tpm at admission, when the output size is
unknown); ``debit`` charges ``cost`` unconditionally (tpm after the call, with the real
tokens), so a bucket may go negative and later requests wait until it refills.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from gateway.core.errors import RateLimitError

Mode = Literal["take", "check", "debit"]
MAX_BUCKETS: Final = 100_000


@dataclass(frozen=True, slots=True)
class BucketCheck:
    key: str  # e.g. "rpm:key:abc123" (never a secret)
    capacity: int  # the per-minute limit
    cost: float
    mode: Mode
    what: str  # human words for the error, e.g. "60 requests per minute for key 'abc123'"

    @property
    def rate(self) -> float:
        return self.capacity / 60.0


def bucket_step(tokens: float, check: BucketCheck) -> tuple[float, float]:
    """(tokens after, seconds to wait); a wait > 0 means refused and tokens unchanged."""
    if check.mode == "take":
        if tokens < check.cost:
            return tokens, (check.cost - tokens) / check.rate
        return tokens - check.cost, 0.0
    if check.mode == "check":
        return tokens, 0.0 if tokens >= 1.0 else (1.0 - tokens) / check.rate
    return tokens - check.cost, 0.0


def refused(check: BucketCheck, wait: float) -> RateLimitError:
    return RateLimitError(f"Rate limit reached: {check.what}", retry_after=max(1.0, wait))


class MemoryBuckets:
    """Token buckets in this process (exact for one replica)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_buckets: int = MAX_BUCKETS) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)
        self._clock = clock
        self._max = max_buckets

    def apply(self, checks: Sequence[BucketCheck]) -> tuple[int, float] | None:
        """Apply all checks atomically. None if admitted, else (index refused, seconds to wait)."""
        now = self._clock()
        after: list[float] = []
        for i, c in enumerate(checks):
            tokens, last = self._buckets.get(c.key, (float(c.capacity), now))
            tokens = min(float(c.capacity), tokens + (now - last) * c.rate)
            tokens, wait = bucket_step(tokens, c)
            if wait > 0:
                return i, wait
            after.append(tokens)
        if len(self._buckets) + len(checks) > self._max:
            self._buckets.clear()
        for c, tokens in zip(checks, after, strict=True):
            self._buckets[c.key] = (tokens, now)
        return None
