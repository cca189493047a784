"""What the budgets report and how they start: every configured budget (policy and key
store), its limit, spent and remaining USD, and seeding from the ledger at start-up. A part
of ``gate.Limits`` (its base class), apart because it runs at start-up and for the admin
reports, never on a request's path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gateway.config.policy import BudgetPolicy, Policy
from gateway.limits.budgets import (
    BudgetLine,
    MemoryBook,
    Period,
    Scope,
    budget_lines,
    period_bounds,
    status_row,
    to_nanos,
)
from gateway.limits.keys import KeyLimits
from gateway.limits.redis_store import RedisStore


class BudgetReports:
    """Needs (from ``Limits``): the in-process book, the Redis store if any, every key's
    limits, and the backend-failure rule."""

    book: MemoryBook
    redis: RedisStore | None
    _key_limits: dict[str, KeyLimits]

    if TYPE_CHECKING:  # defined by ``Limits``

        def key_limits(self, key_id: str | None) -> KeyLimits: ...

        def _backend_failed(self, exc: Exception, *, background: bool = False) -> None: ...

    def configured(self, policy: Policy) -> list[tuple[Scope, str, BudgetPolicy]]:
        """Every budget the policy and the key store define (bounded: names come from config)."""
        out: list[tuple[Scope, str, BudgetPolicy]] = []
        for key_id, kl in self._key_limits.items():
            if kl.daily_usd is not None or kl.monthly_usd is not None:
                out.append(("key", key_id, BudgetPolicy(daily_usd=kl.daily_usd, monthly_usd=kl.monthly_usd)))
        out += [("tenant", n, t.budget) for n, t in policy.tenants.items() if t.budget != BudgetPolicy()]
        out += [("route", n, r.budget) for n, r in policy.routes.items() if r.budget != BudgetPolicy()]
        return out

    def _all_lines(self, policy: Policy) -> list[BudgetLine]:
        self.key_limits("")  # refresh when stale
        now = time.time()
        lines: list[BudgetLine] = []
        for scope, name, budget in self.configured(policy):
            key_id = name if scope == "key" else None
            tenant = name if scope == "tenant" else ""
            route = name if scope == "route" else ""
            kb = budget if scope == "key" else None
            lines += [ln for ln in budget_lines(policy, tenant, key_id, kb, route, now) if ln.scope == scope]
        return lines

    async def status(self, policy: Policy) -> list[dict[str, Any]]:
        """Limit, spent (incl. reserved) and remaining USD of every configured budget."""
        lines = self._all_lines(policy)
        spent = [self.book.spent(ln) for ln in lines]
        if self.redis is not None and lines:
            try:
                spent = await self.redis.spent(lines)
            except Exception as exc:
                self._backend_failed(exc, background=True)
        return [status_row(ln, s) for ln, s in zip(lines, spent, strict=True)]

    async def seed(
        self, policy: Policy, spent_since: Callable[[Scope, float], Mapping[str, Decimal]]
    ) -> None:
        """Start every configured budget at what the ledger says its period already spent."""
        now = time.time()
        cache: dict[tuple[Scope, Period], Mapping[str, Decimal]] = {}
        for line in self._all_lines(policy):
            k = (line.scope, line.period)
            if k not in cache:
                start = period_bounds(line.period, now)[1]
                cache[k] = await asyncio.to_thread(spent_since, line.scope, start)
            nanos = to_nanos(cache[k].get(line.name, Decimal(0)))
            if nanos <= 0:
                continue
            self.book.seed(line, nanos)
            if self.redis is not None:
                try:
                    await self.redis.seed(line, nanos)
                except Exception as exc:
                    self._backend_failed(exc, background=True)
