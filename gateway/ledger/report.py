"""Spend reports over the ledger (SQLite or PostgreSQL): spend by model/route/tenant/key/
provider over time buckets, savings by cause, budget seeding, text table, JSON and CSV.

All sums are exact (see ``query``); money leaves as ``Decimal`` or exact decimal strings.
"""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal, get_args

from gateway.ledger.db import GROUP_SQL, ZERO, LedgerDb, Window, open_db
from gateway.ledger.query import grouped
from gateway.ledger.schema import FEEDBACK_TABLE, TABLE

GroupBy = Literal["model", "route", "tenant", "provider", "key", "conversation", "error", "task"]
GROUP_BY_CHOICES: Final[tuple[str, ...]] = get_args(GroupBy)
Group = Literal[
    "model", "route", "tenant", "provider", "key", "conversation", "error", "task", "cause", "none"
]
GROUPS: Final[tuple[str, ...]] = get_args(Group)
Bucket = Literal["hour", "day", "month", "none"]
BUCKETS: Final[tuple[str, ...]] = get_args(Bucket)
NONE_LABEL: Final = "(none)"
_SINCE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_SECONDS: Final[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ZERO: Final = ZERO
TOP_CONVERSATIONS: Final = 20  # a conversation report lists the most expensive ones only


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
    rated: int = 0  # requests with feedback (POST /v1/feedback, `switchyard feedback import`)
    score_sum: float = 0.0  # their scores added up

    @property
    def cached_share(self) -> float | None:
        """Cached input tokens over all input tokens (prompt-cache reads): None without input."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else None

    @property
    def quality(self) -> float | None:
        """The mean feedback score (0..1) of the rated requests: None without feedback."""
        return self.score_sum / self.rated if self.rated else None


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


def _window(
    since_seconds: float | None, now: float | None, until: float | None, tenant: str | None
) -> Window:
    since = None if since_seconds is None else (time.time() if now is None else now) - since_seconds
    if since is not None and since <= 0:  # a window reaching past the epoch: every row
        since = None
    return Window(since, until, tenant)


def _line(db: LedgerDb, key: Any, r: Sequence[Any]) -> SpendLine:
    return SpendLine(
        key=None if key is None else str(key),
        requests=int(r[0]),
        errors=int(r[1] or 0),
        unpriced=int(r[2] or 0),
        input_tokens=int(r[3]),
        cached_tokens=int(r[4]),
        output_tokens=int(r[5]),
        cost_usd=db.money(r[6]),
        baseline_cost_usd=db.money(r[7]),
        savings_usd=db.money(r[8]),
    )


def _check(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ValueError(f"bad {what} {value!r}: expected one of {', '.join(choices)}")


def _top(group: str, top: int | None) -> int | None:
    if top is not None and top < 1:
        raise ValueError("top must be at least 1")
    if group == "conversation":
        return TOP_CONVERSATIONS if top is None else top
    return top


def spend(
    path_or_url: str | Path,
    by: GroupBy,
    since_seconds: float | None,
    *,
    now: float | None = None,
    until: float | None = None,
    tenant: str | None = None,
    top: int | None = None,
    rollups: bool = True,
) -> list[SpendLine]:
    """Spend grouped ``by`` over the last ``since_seconds`` (None: all time), most expensive
    first (the ``top`` most expensive; conversations: the top ``TOP_CONVERSATIONS`` unless
    told, rows without one left out). A missing ledger file or an empty/unmigrated database
    gives an empty report. ``rollups=False``: from the raw rows alone (the check and the
    benchmark's baseline)."""
    _check(by, GROUP_BY_CHOICES, "group")
    limit = _top(by, top)
    window = _window(since_seconds, now, until, tenant)
    with open_db(path_or_url) as db:
        if db is None:
            return []
        db.rollups = db.rollups and rollups
        lines = [
            _line(db, key, sums) for (_, key), sums in grouped(db, by, "none", window, top=limit).items()
        ]
        rated = _rated(db, by, window)
    lines = [
        replace(ln, rated=rated[ln.key][0], score_sum=rated[ln.key][1]) if ln.key in rated else ln
        for ln in lines
    ]
    lines.sort(key=lambda ln: (-ln.cost_usd, ln.key is None, ln.key or ""))
    return lines if limit is None else lines[:limit]


def _rated(db: LedgerDb, by: str, window: Window) -> dict[str | None, tuple[int, float]]:
    """Per group: (requests with feedback, their scores added up), over the window. Driven by
    the feedback table (the rated requests only), joined to their ledger rows."""
    if not db.has_table(FEEDBACK_TABLE):
        return {}
    where, params = window.where()
    rows = db.rows(
        f"SELECT {GROUP_SQL[by]}, COUNT(*), SUM(fscore) FROM "
        f"(SELECT request_id AS fid, score AS fscore FROM {FEEDBACK_TABLE}) f "
        f"JOIN {TABLE} ON {TABLE}.request_id = f.fid{where} GROUP BY 1",
        params,
    )
    return {None if r[0] is None else str(r[0]): (int(r[1]), float(r[2] or 0.0)) for r in rows}


def spend_series(
    url: str | Path,
    group: str,
    bucket: str,
    since_seconds: float | None,
    *,
    now: float | None = None,
    until: float | None = None,
    tenant: str | None = None,
    top: int | None = None,
    rollups: bool = True,
) -> list[dict[str, Any]]:
    """Spend per (time bucket, group), oldest bucket first; money as exact decimal strings.
    ``group``: model|route|tenant|provider|key|conversation|cause|none; ``bucket``:
    hour|day|month|none (labels ``2026-11-30T05:00:00Z``, ``2026-11-30``, ``2026-11``,
    ``all``; UTC). Conversations: the ``top`` most expensive over the window (see ``spend``)."""
    _check(group, GROUPS, "group_by")
    _check(bucket, BUCKETS, "bucket")
    limit = _top(group, top) if group == "conversation" else None
    window = _window(since_seconds, now, until, tenant)
    with open_db(url) as db:
        if db is None:
            return []
        db.rollups = db.rollups and rollups
        out = []
        for (when, key), sums in grouped(db, group, bucket, window, top=limit).items():
            ln = _line(db, key, sums)
            out.append(
                {"bucket": db.bucket_label(bucket, when), "group": ln.key, **_line_json(ln, False, False)}
            )
    out.sort(key=lambda d: (d["bucket"], d["group"] is None, d["group"] or ""))
    return out


def savings_by_cause(
    url: str | Path,
    bucket: str,
    since_seconds: float | None,
    *,
    now: float | None = None,
    until: float | None = None,
    tenant: str | None = None,
) -> list[dict[str, Any]]:
    """Savings (baseline − cost, where both are known) per (time bucket, cause); causes are
    exact_cache, semantic_cache, self_hosted, batch, routing and none."""
    rows = spend_series(url, "cause", bucket, since_seconds, now=now, until=until, tenant=tenant)
    return [{"cause": r["group"], **{k: r[k] for k in SAVINGS_COLUMNS[1:]}} for r in rows]


# The columns of ``spend_series`` and ``savings_by_cause`` rows (the header of an empty report).
LINE_COLUMNS = (
    "requests", "errors", "unpriced", "input_tokens", "cached_tokens", "cached_share",
    "output_tokens", "cost_usd", "baseline_cost_usd", "savings_usd",
)  # fmt: skip
SERIES_COLUMNS = ("bucket", "group", *LINE_COLUMNS)
SAVINGS_COLUMNS = ("cause", "bucket", "requests", "cost_usd", "baseline_cost_usd", "savings_usd")


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Report rows as CSV: the header is ``columns`` (written also when there are no rows:
    ``SERIES_COLUMNS``, ``SAVINGS_COLUMNS``), else the first row's keys (nothing when empty)."""
    fields = list(columns) if columns is not None else list(rows[0]) if rows else None
    if fields is None:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


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
        rated=sum(ln.rated for ln in lines),
        score_sum=sum(ln.score_sum for ln in lines),
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
        "-" if ln.cached_share is None else f"{ln.cached_share:.0%}",
        f"{ln.output_tokens:,}",
        _usd(ln.cost_usd),
        _usd(ln.baseline_cost_usd),
        _usd(ln.savings_usd),
        "-" if ln.quality is None else f"{ln.quality:.2f} ({ln.rated:,})",
    ]


def format_table(lines: list[SpendLine], by: str = "key") -> str:
    """An aligned text table (money rounded to 1e-6 USD for display) with a TOTAL line."""
    header = [by.upper(), "REQUESTS", "ERRORS", "INPUT", "CACHED", "CACHED%", "OUTPUT"]
    header += ["COST_USD", "BASELINE_USD", "SAVINGS_USD", "QUALITY"]
    body = [_cells(NONE_LABEL if ln.key is None else ln.key, ln) for ln in lines]
    foot = _cells("TOTAL", total(lines))
    widths = [max(len(row[i]) for row in [header, *body, foot]) for i in range(len(header))]

    def render(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    rows = [rule, *(render(r) for r in body), rule] if body else [rule]
    return "\n".join([render(header), *rows, render(foot)])


def _line_json(ln: SpendLine, with_key: bool = True, with_quality: bool = True) -> dict[str, Any]:
    """A line as JSON; ``with_quality``: its feedback (a time series has none per bucket)."""
    out: dict[str, Any] = {"key": ln.key} if with_key else {}
    out |= {
        "requests": ln.requests,
        "errors": ln.errors,
        "unpriced": ln.unpriced,
        "input_tokens": ln.input_tokens,
        "cached_tokens": ln.cached_tokens,
        "cached_share": None if ln.cached_share is None else round(ln.cached_share, 4),
        "output_tokens": ln.output_tokens,
        "cost_usd": f"{ln.cost_usd:f}",
        "baseline_cost_usd": f"{ln.baseline_cost_usd:f}",
        "savings_usd": f"{ln.savings_usd:f}",
    }
    if with_quality:
        out |= {"rated": ln.rated, "quality": None if ln.quality is None else round(ln.quality, 4)}
    return out


def to_json(lines: list[SpendLine], by: str, since: str | None) -> dict[str, Any]:
    """The report as one JSON-ready object; money as exact decimal strings."""
    return {
        "by": by,
        "since": since,
        "since_seconds": None if since is None else parse_since(since),
        "lines": [_line_json(ln) for ln in lines],
        "total": {k: v for k, v in _line_json(total(lines)).items() if k != "key"},
    }
