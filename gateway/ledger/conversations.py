"""The top N conversations by cost of a report's window, exactly as one SQL ranking puts them
(``SUM(cost) DESC NULLS LAST, conversation``); ``query`` then sums only their rows.

Two ways to the same answer. The plain ranking groups the window's rows from the covering ts
index (schema v5: ts, conversation, cost), never the rows themselves: it reads every row of the
window. With the conversation spans kept (schema v8, ``spans``) a window of ``MIN_DAYS`` to 32
days takes one span row per conversation instead: ``c{b} - c{a-1}`` bounds from above what each
conversation spent on days a..b (edge days counted whole: the loose bound; a refund cannot raise
a positive-part sum). The best-bounded are summed exactly (the covering (conversation, ts, cost)
index, schema v9), and the answer stands once the N-th exact sum is strictly above every bound
not summed; ties, NULL costs and the order of names come out as the plain ranking's. When that
first round does not settle it (windows under ``LOOSE_DAYS`` start here), the tight bound cuts
each edge day to its part inside the window, read exactly from the ts index, and every
conversation whose tight bound reaches the N-th sum found so far is summed: they hold the true
top N. More than ``MAX_CANDIDATES`` of them, a tenant filter, an open start or a window outside
those lengths take the plain ranking. On SQLite the rows after the rollup mark are not in the
spans yet: their conversations (a rowid range) are always candidates, and their rows are never
subtracted from a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Final

from gateway.ledger.db import LedgerDb, Window
from gateway.ledger.schema import SPAN_TABLE, TABLE
from gateway.ledger.spans import STEP, day_of, day_start

MAX_CANDIDATES: Final = 4096
MIN_DAYS: Final = 2  # shorter windows: the plain ranking (it reads no more rows than the edges)
LOOSE_DAYS: Final = 7  # from this long, the first round's bounds come from the span rows alone
DAY: Final = 86_400


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
    if last - first >= STEP or until - since < MIN_DAYS * DAY:
        return None  # longer than a span step; or so short that the plain ranking reads less
    span = first // STEP
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
    tight = _tight(db, span, first, last, since, until)
    cheap = _loose(span, first, last) if until - since >= LOOSE_DAYS * DAY else tight
    k = max(4 * n, 64)
    sql, params = cheap
    got = db.rows(f"SELECT conversation, b FROM ({sql}) AS t ORDER BY b DESC LIMIT ?", (*params, k + 1))
    ranked = _exact(db, since, until, sorted({str(r[0]) for r in got[:k]} | recent))
    if len(got) <= k:  # every conversation of the span was a candidate
        return [c for c, _ in ranked[:n]]
    nth = ranked[n - 1][1] if len(ranked) >= n else None
    if nth is None:
        return None
    if nth > int(got[k][1]):  # no conversation left out can reach the n-th sum
        return [c for c, _ in ranked[:n]]
    # every conversation whose tight bound reaches the n-th sum found so far (ties included)
    # holds every one of the true top n: sum them all
    sql, params = tight
    reach = f"SELECT conversation FROM ({sql}) AS t WHERE b >= ? LIMIT ?"
    above = db.rows(reach, (*params, nth, MAX_CANDIDATES + 1))
    names = {str(r[0]) for r in above} | recent
    if len(names) > MAX_CANDIDATES:
        return None
    return [c for c, _ in _exact(db, since, until, sorted(names))[:n]]


Bounds = tuple[str, tuple[Any, ...]]  # SQL of (conversation, b: an upper bound of its window spend)


def _loose(span: int, first: int, last: int) -> Bounds:
    """From the span row alone: the whole days the window touches (edge days counted whole)."""
    lo, hi = first - STEP * span, last - STEP * span
    expr = f"c{hi}" if lo == 0 else f"c{hi} - c{lo - 1}"
    return f"SELECT conversation, {expr} AS b FROM {SPAN_TABLE} WHERE span = ?", (span,)


def _tight(db: LedgerDb, span: int, first: int, last: int, since: float, until: float) -> Bounds:
    """The loose bound with each edge day cut to its part inside the window, read exactly from
    the covering ts index: the smaller part of the day, either the part outside the window
    (subtracted: rows in the spans only, ``id <= mark`` on SQLite) or the part inside it (added,
    the day left out of the span's sum). For a conversation without refunds the bound is its
    exact spend in the window."""
    lo, hi = first - STEP * span, last - STEP * span
    start, end = lo - 1, hi  # the span's days summed: start + 1 .. end
    parts: list[Bounds] = []
    a, b = day_start(first), day_start(first + 1)
    if since - a <= b - since:
        parts.append(_edge(db, -1, a, since))
    else:
        start = lo
        parts.append(_edge(db, 1, since, b))
    a, b = day_start(last), day_start(last + 1)
    if b - until <= until - a:
        parts.append(_edge(db, -1, until, b))
    else:
        end = hi - 1
        parts.append(_edge(db, 1, a, until))
    whole = f"s.c{end}" if start < 0 else f"s.c{end} - s.c{start}"
    edges = " UNION ALL ".join(sql for sql, _ in parts)
    sql = (
        f"SELECT s.conversation, {whole} + COALESCE(a.d, 0) AS b FROM {SPAN_TABLE} AS s LEFT JOIN "
        f"(SELECT conversation, CAST(SUM(d) AS BIGINT) AS d FROM ({edges}) AS e GROUP BY conversation) AS a "
        "ON a.conversation = s.conversation WHERE s.span = ?"
    )
    return sql, (*(p for _, ps in parts for p in ps), span)


def _edge(db: LedgerDb, sign: int, a: float, b: float) -> Bounds:
    """``sign`` x the positive part of each cost (1e-10 USD, as the spans keep it) of the rows
    with ``a <= ts < b`` (one edge day's part: ``spans.day_start`` bounds); subtracted rows
    (``sign`` -1) only from those in the spans."""
    if db.dialect == "sqlite":
        pos = "CASE WHEN cost_e10 > 0 THEN cost_e10 ELSE 0 END"
    else:
        pos = "CASE WHEN cost_usd > 0 THEN CAST(round(cost_usd * 10000000000) AS BIGINT) ELSE 0 END"
    sql = f"SELECT conversation, {sign} * {pos} AS d FROM {TABLE} WHERE ts >= ? AND ts < ?"
    sql += " AND conversation IS NOT NULL"
    params: tuple[Any, ...] = (a, b)
    if sign < 0 and db.rolled_through is not None:
        sql, params = sql + " AND id <= ?", (*params, db.rolled_through)
    return sql, params


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
