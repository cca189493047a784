"""Spend reports over the ledger: grouping, exact Decimal sums, text table and JSON."""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal, get_args

from gateway.ledger.pricing import quantize_usd
from gateway.ledger.sqlite import BUSY_TIMEOUT_MS, TABLE, ledger_path

GroupBy = Literal["model", "route", "tenant", "provider", "key"]
GROUP_BY_CHOICES: Final[tuple[str, ...]] = get_args(GroupBy)
# Cache hits have no served model/provider: they are grouped as "(cache)".
_CACHE_LABEL: Final = "(cache)"
_GROUP_COLUMN: Final[dict[str, str]] = {
    "model": f"COALESCE(served_model, CASE WHEN cache_status = 'hit' THEN '{_CACHE_LABEL}' END)",
    "route": "route",
    "tenant": "tenant",
    "provider": f"COALESCE(provider, CASE WHEN cache_status = 'hit' THEN '{_CACHE_LABEL}' END)",
    "key": "key_id",
}
NONE_LABEL: Final = "(none)"
_SINCE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_SECONDS: Final[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ZERO: Final = Decimal("0E-10")  # sums keep the ledger's 1e-10 USD quantum


@dataclass(frozen=True, slots=True)
class SpendLine:
    """One group of a spend report. Token sums add the known counts only; ``unpriced`` counts
    requests whose cost is unknown. ``savings_usd`` sums baseline − cost over the requests
    where both are known (a request without a baseline saves nothing)."""

    key: str | None
    requests: int
    errors: int
    unpriced: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: Decimal
    baseline_cost_usd: Decimal
    savings_usd: Decimal


def parse_since(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"24h"``, ``"7d"`` -> seconds. ValueError for anything else."""
    m = _SINCE_RE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(
            f"bad duration {text!r}: expected a number and a unit s, m, h or d (e.g. 90s, 30m, 24h, 7d)"
        )
    value = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if value <= 0:
        raise ValueError(f"bad duration {text!r}: must be greater than zero")
    return value


class _DecimalSum:
    """SQLite aggregate: exact sum of Decimal strings (NULLs skipped), returned as a string."""

    def __init__(self) -> None:
        self.total = _ZERO

    def step(self, value: str | None) -> None:
        if value is not None:
            self.total += Decimal(value)

    def finalize(self) -> str:
        return str(self.total)


class _SavingsSum:
    """SQLite aggregate: exact sum of baseline − cost where both are known."""

    def __init__(self) -> None:
        self.total = _ZERO

    def step(self, baseline: str | None, cost: str | None) -> None:
        if baseline is not None and cost is not None:
            self.total += Decimal(baseline) - Decimal(cost)

    def finalize(self) -> str:
        return str(self.total)


def _query(by: str) -> str:
    col = _GROUP_COLUMN[by]
    return (
        f"SELECT {col}, COUNT(*), "
        "SUM(CASE WHEN status = 'ok' THEN 0 ELSE 1 END), "
        "SUM(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END), "
        "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(cached_tokens), 0), "
        "COALESCE(SUM(output_tokens), 0), "
        "decsum(cost_usd), decsum(baseline_cost_usd), savingsum(baseline_cost_usd, cost_usd) "
        f"FROM {TABLE} WHERE ts >= ? GROUP BY 1"
    )


def spend(
    path_or_url: str | Path, by: GroupBy, since_seconds: float | None, *, now: float | None = None
) -> list[SpendLine]:
    """Spend grouped ``by`` over the last ``since_seconds`` (None: all time), most expensive
    first. A missing ledger file or an empty/unmigrated database gives an empty report."""
    if by not in _GROUP_COLUMN:
        raise ValueError(f"bad group {by!r}: expected one of {', '.join(GROUP_BY_CHOICES)}")
    path = ledger_path(path_or_url)
    if not path.is_file():
        return []
    cutoff = float("-inf") if since_seconds is None else (time.time() if now is None else now) - since_seconds
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
        ).fetchone()
        if not exists:
            return []
        # typeshed types aggregates as int-valued; these take and return decimal strings.
        conn.create_aggregate("decsum", 1, _DecimalSum)  # type: ignore[arg-type]
        conn.create_aggregate("savingsum", 2, _SavingsSum)  # type: ignore[arg-type]
        rows = conn.execute(_query(by), (cutoff,)).fetchall()
    finally:
        conn.close()
    lines = [
        SpendLine(
            key=None if r[0] is None else str(r[0]),
            requests=int(r[1]),
            errors=int(r[2]),
            unpriced=int(r[3]),
            input_tokens=int(r[4]),
            cached_tokens=int(r[5]),
            output_tokens=int(r[6]),
            cost_usd=quantize_usd(Decimal(r[7])),
            baseline_cost_usd=quantize_usd(Decimal(r[8])),
            savings_usd=quantize_usd(Decimal(r[9])),
        )
        for r in rows
    ]
    lines.sort(key=lambda ln: (-ln.cost_usd, ln.key is None, ln.key or ""))
    return lines


def total(lines: list[SpendLine]) -> SpendLine:
    """The sum of ``lines`` (key None)."""
    return SpendLine(
        key=None,
        requests=sum(ln.requests for ln in lines),
        errors=sum(ln.errors for ln in lines),
        unpriced=sum(ln.unpriced for ln in lines),
        input_tokens=sum(ln.input_tokens for ln in lines),
        cached_tokens=sum(ln.cached_tokens for ln in lines),
        output_tokens=sum(ln.output_tokens for ln in lines),
        cost_usd=sum((ln.cost_usd for ln in lines), _ZERO),
        baseline_cost_usd=sum((ln.baseline_cost_usd for ln in lines), _ZERO),
        savings_usd=sum((ln.savings_usd for ln in lines), _ZERO),
    )


def _usd(value: Decimal) -> str:
    return f"{value:,.6f}"


def _cells(label: str, ln: SpendLine) -> list[str]:
    return [
        label,
        f"{ln.requests:,}",
        f"{ln.errors:,}",
        f"{ln.input_tokens:,}",
        f"{ln.cached_tokens:,}",
        f"{ln.output_tokens:,}",
        _usd(ln.cost_usd),
        _usd(ln.baseline_cost_usd),
        _usd(ln.savings_usd),
    ]


def format_table(lines: list[SpendLine], by: str = "key") -> str:
    """An aligned text table (money rounded to 1e-6 USD for display) with a TOTAL line."""
    header = [by.upper(), "REQUESTS", "ERRORS", "INPUT", "CACHED", "OUTPUT"]
    header += ["COST_USD", "BASELINE_USD", "SAVINGS_USD"]
    body = [_cells(NONE_LABEL if ln.key is None else ln.key, ln) for ln in lines]
    foot = _cells("TOTAL", total(lines))
    widths = [max(len(row[i]) for row in [header, *body, foot]) for i in range(len(header))]

    def render(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([render(header), rule, *(render(r) for r in body), rule, render(foot)])


def _line_json(ln: SpendLine) -> dict[str, Any]:
    return {
        "key": ln.key,
        "requests": ln.requests,
        "errors": ln.errors,
        "unpriced": ln.unpriced,
        "input_tokens": ln.input_tokens,
        "cached_tokens": ln.cached_tokens,
        "output_tokens": ln.output_tokens,
        "cost_usd": f"{ln.cost_usd:f}",
        "baseline_cost_usd": f"{ln.baseline_cost_usd:f}",
        "savings_usd": f"{ln.savings_usd:f}",
    }


def to_json(lines: list[SpendLine], by: str, since: str | None) -> dict[str, Any]:
    """The report as one JSON-ready object; money as exact decimal strings."""
    return {
        "by": by,
        "since": since,
        "since_seconds": None if since is None else parse_since(since),
        "lines": [_line_json(ln) for ln in lines],
        "total": {k: v for k, v in _line_json(total(lines)).items() if k != "key"},
    }
