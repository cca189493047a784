"""Retries with jittered backoff, Retry-After, per-target circuit breakers, fallbacks and an
overall deadline, for any call shaped ``call(target, timeout) -> T``."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from gateway.core.errors import (
    ServiceUnavailableError,
    SwitchyardError,
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
)
from gateway.core.record import record
from gateway.core.types import Target
from gateway.routing.breaker import BreakerBoard
from gateway.routing.plan import RoutePlan

T = TypeVar("T")

MAX_RETRY_AFTER_S = 20.0  # a longer Retry-After moves on to the next target


@record
class AttemptOutcome(Generic[T]):
    value: T
    target: Target


def backoff_delay(attempt: int, base: float = 0.1, cap: float = 2.0) -> float:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**attempt))."""
    return random.uniform(0.0, min(cap, base * (2**attempt)))


async def run_with_fallback(
    plan: RoutePlan,
    call: Callable[[Target, float], Awaitable[T]],
    breakers: BreakerBoard,
    *,
    started: float,
    on_error: Callable[[Target, SwitchyardError], None] | None = None,
) -> AttemptOutcome[T]:
    policy = plan.policy
    deadline = started + policy.deadline_s
    last: SwitchyardError | None = None
    for target in plan.targets:
        breaker = breakers.get(target.model)
        for retry in range(policy.retries + 1):
            if not breaker.allow():
                last = last or ServiceUnavailableError(
                    f"every upstream for '{plan.name}' is failing; try again shortly"
                )
                break
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise UpstreamTimeoutError(f"deadline of {policy.deadline_s:g}s for '{plan.name}' exceeded")
            try:
                value = await call(target, min(policy.attempt_timeout_s, remaining))
            except UpstreamRejectedError:
                breaker.success()  # the upstream is healthy; the request is at fault
                raise
            except UpstreamError as exc:
                breaker.failure()
                last = exc
                if on_error is not None:
                    on_error(target, exc)
                if not exc.retryable or retry == policy.retries:
                    break
                delay = exc.retry_after if exc.retry_after is not None else backoff_delay(retry)
                if delay > MAX_RETRY_AFTER_S or time.perf_counter() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
                continue
            except BaseException:
                breaker.release()  # no verdict (cancelled, or not an upstream failure)
                raise
            breaker.success()
            return AttemptOutcome(value, target)
    assert last is not None
    raise last
