"""A circuit breaker per target: skip a dead upstream quickly, probe it again later."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(slots=True)
class CircuitBreaker:
    failure_threshold: int = 5
    open_seconds: float = 15.0
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False

    def _now(self) -> float:
        return time.monotonic()

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        if self._now() - self.opened_at >= self.open_seconds:
            return "half_open"
        return "open"

    def allow(self) -> bool:
        """May a request go to this target now? In half-open state one probe at a time."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self.probing:
            self.probing = True
            return True
        return False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def release(self) -> None:
        """The attempt ended without a verdict on the upstream (cancelled, or failed outside
        it): free the half-open probe slot so a later request can probe."""
        self.probing = False

    def failure(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.failure_threshold:
            self.opened_at = self._now()
        self.probing = False


class BreakerBoard:
    """All breakers, keyed by target model name; survives policy reloads."""

    def __init__(self, failure_threshold: int = 5, open_seconds: float = 15.0) -> None:
        self._threshold = failure_threshold
        self._open_seconds = open_seconds
        self._breakers: dict[str, CircuitBreaker] = {}

    def configure(self, failure_threshold: int, open_seconds: float) -> None:
        self._threshold = failure_threshold
        self._open_seconds = open_seconds
        for b in self._breakers.values():
            b.failure_threshold = failure_threshold
            b.open_seconds = open_seconds

    def get(self, name: str) -> CircuitBreaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = CircuitBreaker(self._threshold, self._open_seconds)
            self._breakers[name] = breaker
        return breaker

    def states(self) -> dict[str, str]:
        return {name: b.state for name, b in self._breakers.items()}
