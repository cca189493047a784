"""The learned route's planner helpers, pure: a task's efficient frontier over its models'
estimates, and the largest share of a move that keeps a bound non-negative."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Point(Protocol):
    @property
    def mean(self) -> float: ...

    @property
    def cost(self) -> float: ...


E = TypeVar("E", bound=Point)


def frontier(estimates: Sequence[E]) -> list[E]:
    """A task's efficient frontier, from its best model (highest mean; the cheaper of a tie)
    down to cheaper ones: each next model is the one that loses the least quality per dollar
    saved (the upper convex hull of (cost, mean)), so mixing two neighbours is never beaten
    by another pair."""
    cur = max(estimates, key=lambda e: (e.mean, -e.cost))
    out = [cur]
    while True:
        cheaper = [e for e in estimates if e.cost < cur.cost]
        if not cheaper:
            return out
        cur = min(cheaper, key=lambda e: ((cur.mean - e.mean) / (cur.cost - e.cost), e.cost))
        out.append(cur)


def part(fn: Callable[[float], float]) -> float:
    """The largest share f in [0, 1] of a task's traffic a move can take with the bound >= 0
    (``fn``: f -> the bound; monotone enough for bisection)."""
    lo, hi = 0.0, 1.0
    if fn(lo) < 0:
        return 0.0
    for _ in range(20):
        mid = (lo + hi) / 2
        if fn(mid) >= 0:
            lo = mid
        else:
            hi = mid
    return lo
