"""USD budgets per key, tenant and route, per UTC day and calendar month.

Money is counted in integer nano-dollars (1e-9 USD) so that the same arithmetic runs in this
process and in Redis (Lua numbers are doubles: exact up to 2^53 nanos, about 9 million USD
per counter and period). Amounts are rounded *up* to the nano, so a counter never under-states.

A request reserves its worst case (``worst_case_nanos``) on every budget that applies to it,
all or none (``MemoryBook.reserve``); after the call the reservation is settled to the real
cost (or kept whole when the cost is unknown) or released on failure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final, Literal

from gateway.config.policy import BudgetPolicy, Policy
from gateway.core.errors import RateLimitError
from gateway.core.types import Price

Period = Literal["day", "month"]
Scope = Literal["key", "tenant", "route"]
NANOS_PER_USD: Final = 1_000_000_000
_NANO: Final = Decimal(1) / NANOS_PER_USD
MAX_BUDGETS: Final = 100_000


def to_nanos(usd: Decimal) -> int:
    """USD -> nano-dollars, rounded up."""
    return math.ceil(usd * NANOS_PER_USD)


def from_nanos(nanos: int) -> Decimal:
    """Nano-dollars -> USD with 9 places, exact at any size (no context rounding or overflow)."""
    sign, digits, _ = Decimal(int(nanos)).as_tuple()
    return Decimal((sign, digits, -9))


def period_bounds(period: Period, now: float) -> tuple[str, float, float]:
    """(period id, start, end) in unix seconds for the UTC day or month containing ``now``."""
    dt = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = datetime(dt.year, dt.month, dt.day, tzinfo=UTC)
        end = start + timedelta(days=1)
        return start.strftime("%Y-%m-%d"), start.timestamp(), end.timestamp()
    start = datetime(dt.year, dt.month, 1, tzinfo=UTC)
    end = datetime(dt.year + (dt.month == 12), dt.month % 12 + 1, 1, tzinfo=UTC)
    return start.strftime("%Y-%m"), start.timestamp(), end.timestamp()


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One cap that applies to a request, in one period instance."""

    scope: Scope
    name: str
    period: Period
    period_id: str
    limit: int  # nanos
    ends_at: float  # unix seconds: when the period resets

    @property
    def counter(self) -> str:
        return f"{self.scope}:{self.name}:{self.period}:{self.period_id}"

    def describe(self) -> str:
        per = "daily" if self.period == "day" else "monthly"
        return f"{per} budget of {from_nanos(self.limit).normalize():f} USD for {self.scope} '{self.name}'"


@dataclass(slots=True)
class Reservation:
    """What one request holds on its budgets until it is settled or released."""

    lines: tuple[BudgetLine, ...]
    amount: int  # nanos held on each line
    remote: bool  # held in Redis (else in process)
    open: bool = True


def dearest_rates(prices: Iterable[Price]) -> tuple[Decimal, Decimal]:
    """(input, output) USD per 1M tokens: the highest of ``prices`` (cache writes included)."""
    in_rate = Decimal(0)
    out_rate = Decimal(0)
    for p in prices:
        in_rate = max(in_rate, p.input, p.cache_write or in_rate, p.cached_input or in_rate)
        out_rate = max(out_rate, p.output)
    return in_rate, out_rate


def worst_case_nanos(prompt_tokens: int, max_output_tokens: int, prices: Iterable[Price]) -> int:
    """The most a request can cost on any of ``prices`` (prompt at the dearest input rate,
    cache writes included, plus every output token at the dearest output rate)."""
    in_rate, out_rate = dearest_rates(prices)
    micro = max(0, prompt_tokens) * in_rate + max(0, max_output_tokens) * out_rate
    return math.ceil(micro * 1000)  # USD per 1M tokens x tokens = micro-USD; x1000 = nanos


def _caps(scope: Scope, name: str, budget: BudgetPolicy | None, now: float) -> list[BudgetLine]:
    lines: list[BudgetLine] = []
    if budget is None:
        return lines
    periods: tuple[tuple[Period, Decimal | None], ...] = (
        ("day", budget.daily_usd),
        ("month", budget.monthly_usd),
    )
    for period, usd in periods:
        if usd is not None:
            pid, _, end = period_bounds(period, now)
            lines.append(BudgetLine(scope, name, period, pid, to_nanos(usd), end))
    return lines


def budget_lines(
    policy: Policy, tenant: str, key_id: str | None, key_budget: BudgetPolicy | None, route: str, now: float
) -> list[BudgetLine]:
    """Every budget that applies to a request of ``tenant``/``key_id`` on ``route``."""
    lines = _caps("key", key_id, key_budget, now) if key_id is not None else []
    tp = policy.tenants.get(tenant)
    if tp is not None:
        lines += _caps("tenant", tenant, tp.budget, now)
    rp = policy.routes.get(route)
    if rp is not None:
        lines += _caps("route", route, rp.budget, now)
    return lines


def exceeded(line: BudgetLine, now: float) -> RateLimitError:
    """429 naming the budget, with Retry-After = seconds until its period resets."""
    return RateLimitError(
        f"Budget exceeded: the {line.describe()} is spent; it resets at "
        f"{datetime.fromtimestamp(line.ends_at, UTC).isoformat(timespec='seconds')}",
        code="budget_exceeded",
        retry_after=max(1.0, line.ends_at - now),
    )


class MemoryBook:
    """Budget counters (spent + reserved, nanos) in this process."""

    def __init__(self, max_counters: int = MAX_BUDGETS) -> None:
        self._spent: dict[str, int] = {}
        self._max = max_counters

    def reserve(self, lines: Sequence[BudgetLine], amount: int) -> int | None:
        """Hold ``amount`` on every line, or on none: returns the index of the first line it
        would overrun (nothing held), else None. A zero amount always passes."""
        spent = self._spent
        if amount > 0:
            for i, line in enumerate(lines):
                if spent.get(line.counter, 0) + amount > line.limit:
                    return i
        if len(spent) + len(lines) > self._max:
            self._prune()
        for line in lines:
            spent[line.counter] = spent.get(line.counter, 0) + amount
        return None

    def adjust(self, lines: Sequence[BudgetLine], delta: int) -> None:
        for line in lines:
            self._spent[line.counter] = self._spent.get(line.counter, 0) + delta

    def seed(self, line: BudgetLine, spent: int) -> None:
        """Start a counter at what the ledger says was already spent (never lowers it)."""
        self._spent[line.counter] = max(self._spent.get(line.counter, 0), spent)

    def spent(self, line: BudgetLine) -> int:
        return self._spent.get(line.counter, 0)

    def _prune(self) -> None:
        """Drop counters of periods that are over (their ids are no longer current)."""
        now = time.time()
        current = {period_bounds("day", now)[0], period_bounds("month", now)[0]}
        self._spent = {k: v for k, v in self._spent.items() if k.rsplit(":", 1)[1] in current}


def status_row(line: BudgetLine, spent: int) -> dict[str, Any]:
    """One budget's limit, spent (reserved included) and remaining USD, as reports show it."""
    return {
        "scope": line.scope,
        "name": line.name,
        "period": line.period,
        "period_id": line.period_id,
        "limit_usd": from_nanos(line.limit),
        "spent_usd": from_nanos(spent),
        "remaining_usd": from_nanos(max(0, line.limit - spent)),
        "resets_at": line.ends_at,
    }
