"""The learned route's planner helpers, pure: a task's efficient frontier over its models'
estimates, the largest share of a move that keeps a bound non-negative, and the route's
margin summed over tasks."""

from __future__ import annotations

import math
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


Part = tuple[float, float, dict[str, float]]  # a task's margin term: mean, own variance, shared sds


class Totals:
    """The route's margin summed over tasks: the tasks' own variances add, while a model's
    shared (centre) spread adds up across its tasks before it is squared (one error for all)."""

    def __init__(self, need: float, z: float) -> None:
        self.need, self.z = need, z
        self.mean = self.var = 0.0
        self.shared: dict[str, float] = {}

    def add(self, p: Part, sign: float) -> None:
        self.mean += sign * p[0]
        self.var += sign * p[1]
        for m, v in p[2].items():
            self.shared[m] = self.shared.get(m, 0.0) + sign * v

    def lcb(self) -> float:
        var = self.var + sum(v * v for v in self.shared.values())
        return self.mean - self.need - self.z * math.sqrt(max(var, 0.0))

    def lcb_with(self, old: Part, new: Part) -> float:
        """The bound with one task's term ``old`` replaced by ``new``."""
        var = self.var - old[1] + new[1]
        sh = self.shared
        var += sum(v * v for m, v in sh.items() if m not in old[2] and m not in new[2])
        for m in old[2].keys() | new[2].keys():
            v = sh.get(m, 0.0) - old[2].get(m, 0.0) + new[2].get(m, 0.0)
            var += v * v
        return self.mean - old[0] + new[0] - self.need - self.z * math.sqrt(max(var, 0.0))
