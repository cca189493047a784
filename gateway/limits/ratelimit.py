"""Requests-per-minute limits per tenant, in process (a token bucket per tenant)."""

from __future__ import annotations

import time

from gateway.core.errors import RateLimitError


class RpmLimiter:
    def __init__(self, max_tenants: int = 100_000) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, last refill)
        self._max = max_tenants

    def check(self, tenant: str, rpm: int | None) -> None:
        """Take one request from the tenant's bucket or raise 429 with Retry-After."""
        if rpm is None:
            return
        now = time.monotonic()
        rate = rpm / 60.0
        tokens, last = self._buckets.get(tenant, (float(rpm), now))
        tokens = min(float(rpm), tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            wait = (1.0 - tokens) / rate
            raise RateLimitError(
                f"Rate limit of {rpm} requests per minute reached for tenant '{tenant}'",
                retry_after=max(1.0, wait),
            )
        if len(self._buckets) >= self._max and tenant not in self._buckets:
            self._buckets.clear()
        self._buckets[tenant] = (tokens - 1.0, now)
