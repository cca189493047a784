"""The top N conversations by cost of a report's window, exactly as one SQL ranking puts them
(``SUM(cost) DESC NULLS LAST, conversation``); ``query`` then sums only their rows.

Two ways to the same answer. The plain ranking groups the window's rows from the covering ts
index (schema v5: ts, conversation, cost), never the rows themselves: it reads every row of the
window. With the conversation spans kept (schema v8, ``spans``) a window of ``MIN_DAYS`` to 32
days takes one span row per conversation instead: ``c{b} - c{a-1}`` bounds from above what each
conversation spent on days a..b (partial edge days count whole; a refund cannot raise a
positive-part sum). The best-bounded are summed exactly (the (conversation, ts) index), and the
answer stands once the N-th exact sum is strictly above every bound not summed; ties, NULL costs
and the order of names come out as the plain ranking's. When a first round does not settle it,
one count says how many conversations could still reach the N-th sum, and those are all summed;
more than ``MAX_CANDIDATES`` of them, a tenant filter, an open start or a window outside those
lengths take the plain ranking. On SQLite the rows after the rollup mark are not in the spans yet:
their conversations (a rowid range) are always candidates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

from gateway.ledger.db import LedgerDb, Window
from gateway.ledger.schema import SPAN_TABLE, TABLE
from gateway.ledger.spans import STEP, day_of

MAX_CANDIDATES: Final = 4096
MIN_DAYS: Final = 7  # shorter windows: the plain ranking (a partial edge day would loosen every bound)


def top(
    db: LedgerDb, window: Window, where: str, params: tuple[Any, ...], n: int, *, spans: bool = True
) -> list[str]:
    """The ``n`` most expensive conversations among the rows ``where`` (with ``params``) picks in
    ``window``. ``spans=False``: ``where`` holds more than the window (the plain ranking only)."""
    if spans and window.tenant is None and db.rollups:
        found = from_spans(db, window.since, window.until, n)
        if found is not None:
            return found
    return plain(db, where, params, n)


def plain(db: LedgerDb, where: str, params: tuple[Any, ...], n: int) -> list[str]:
    """The ranking's SQL over the rows ``where`` picks."""
    sql = (
        f"SELECT {db.group_sql('conversation')} FROM {TABLE}{where} GROUP BY 1 "
        f"ORDER BY SUM({db.cost}) DESC NULLS LAST, 1 LIMIT ?"
    )
    return [r[0] for r in db.rows(sql, (*params, n))]


def among(ids: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The condition picking the rows of the conversations ``ids``."""
    return f" AND conversation IN ({', '.join('?' for _ in ids)})", tuple(ids)


def from_spans(db: LedgerDb, since: float | None, until: float | None, n: int) -> list[str] | None:
    """The spans' answer for ``since <= ts < until``; None when they cannot give one."""
    if not db.spans or since is None or n <= 0 or since < 0:
        return None
    if until is None:  # up to now: up to the latest row (the same rows)
        (latest,) = db.rows(f"SELECT MAX(ts) FROM {TABLE}")[0]
        if latest is None:
            return None
        until = math.nextafter(float(latest), math.inf)
    first, last = day_of(since), day_of(until)
    if last - first >= STEP or until - since < MIN_DAYS * 86_400:
        return None  # longer than a span step; or so short that its edge days dominate the bounds
    span = first // STEP
    lo, hi = first - STEP * span, last - STEP * span
    bound_sql = f"c{hi}" if lo == 0 else f"c{hi} - c{lo - 1}"
    recent: set[str] = set()  # SQLite: conversations with rows not rolled up yet (not in the spans)
    if db.rolled_through is not None:
        recent = {
            str(r[0])
            for r in db.rows(
                f"SELECT conversation FROM {TABLE} WHERE id > ? AND +conversation IS NOT NULL "
                "AND +ts >= ? AND +ts < ?",  # a rowid range, never an index walk ('+', no DISTINCT)
                (db.rolled_through, since, until),
            )
        }
    k = max(4 * n, 64)
    for attempt in range(2):
        got = db.rows(
            f"SELECT conversation, {bound_sql} FROM {SPAN_TABLE} WHERE span = ? ORDER BY 2 DESC LIMIT ?",
            (span, k + 1),
        )
        done = len(got) <= k  # every conversation of the span is a candidate
        beyond = None if done else int(got[k][1])  # no conversation left out spent more
        ranked = _exact(db, since, until, sorted({str(r[0]) for r in got[:k]} | recent))
        if done:
            return [c for c, _ in ranked[:n]]
        nth = ranked[n - 1][1] if len(ranked) >= n else None
        if nth is not None and beyond is not None and nth > beyond:
            return [c for c, _ in ranked[:n]]
        if nth is None or attempt:
            return None
        # every conversation that could still reach the n-th sum (ties included): sum them all
        (above,) = db.rows(
            f"SELECT COUNT(*) FROM {SPAN_TABLE} WHERE span = ? AND {bound_sql} >= ?", (span, nth)
        )[0]
        if int(above) + len(recent) > MAX_CANDIDATES:
            return None
        k = max(int(above), k + 1)
    return None


def _exact(db: LedgerDb, since: float, until: float, names: Sequence[str]) -> list[tuple[str, int | None]]:
    """The candidates' exact sums (1e-10 USD) in the window, in the plain ranking's order."""
    if not names:
        return []
    extra, ids = among(names)
    rows = db.rows(
        f"SELECT conversation, SUM({db.cost}) FROM {TABLE} WHERE ts >= ? AND ts < ?{extra} GROUP BY 1",
        (since, until, *ids),
    )
    sums = [(str(r[0]), _e10(r[1], db.dialect)) for r in rows]
    sums.sort(key=lambda cs: (cs[1] is None, -(cs[1] or 0), cs[0]))
    return sums


def _e10(value: Any, dialect: str) -> int | None:
    if value is None:
        return None
    if dialect == "sqlite":
        return int(value)
    return int(Decimal(value).scaleb(10).to_integral_value())
