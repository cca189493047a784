"""Conversation spans (schema v8, opt-in: ``SWITCHYARD_CONVERSATION_SPANS=1``): the top N
conversations by cost of a window of up to 32 days from one row per conversation.

``ledger_conversation_span`` holds, per span and conversation, ``c0`` .. ``c63``: running sums
of the positive part of the conversation's cost (integer 1e-10 USD) over the span's 64 days
(``c{i}``: days 0..i). Spans start every 32 days (span s: days 32s .. 32s + 63), so a row is in
two spans and every window of up to 32 days lies inside one. For a window touching days a..b of
span s, ``c{b} - c{a-1}`` bounds from above what each conversation spent in it (partial edge
days count whole; a refund cannot raise a positive-part sum). ``top`` takes the best-bounded
conversations, sums their rows in the window exactly (the (conversation, ts) index), and stops
once the N-th exact sum is above every bound it has not summed yet; ties, NULL costs and the
order of names come out exactly as the plain ranking's SQL puts them
(``SUM(cost) DESC NULLS LAST, conversation``). When a first round of candidates does not
settle it, one count says how many conversations could still reach the N-th sum, and those are
all summed; more than ``MAX_CANDIDATES`` of them (or a window longer than 32 or shorter than
``MIN_DAYS`` days, a tenant filter) go back to that SQL.

Writes: the SQLite writer adds rows in its deferred roll (``rollup.roll``, the rows after the
rollup mark are read raw by ``top``); the PostgreSQL shipper in the insert's transaction. Turned
on for an existing ledger, the store back-fills the table once (``enable``); a writer running
without it marks the table stale (``ledger_rollup_mark.spans = 0``) so no report trusts it.
Cost: a wide upsert per row and span (~20-25 µs of writer CPU per row and span on SQLite).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any, Final

from gateway.ledger.schema import ROLLUP_MARK, SPAN_TABLE, TABLE

WIDTH: Final = 64  # days per span
STEP: Final = 32  # days between span starts
COLS: Final = tuple(f"c{i}" for i in range(WIDTH))
MAX_CANDIDATES: Final = 4096
MIN_DAYS: Final = 7  # shorter windows: the plain ranking (a partial edge day would loosen every bound)

_SETS: Final = ", ".join(f"{c} = {SPAN_TABLE}.{c} + excluded.{c}" for c in COLS)


def _upsert(mark: str) -> str:
    return (
        f"INSERT INTO {SPAN_TABLE} (span, conversation, {', '.join(COLS)}) "
        f"VALUES ({', '.join(mark for _ in range(WIDTH + 2))}) "
        f"ON CONFLICT (span, conversation) DO UPDATE SET {_SETS}"
    )


UPSERT: Final = {"sqlite": _upsert("?"), "postgres": _upsert("%s")}


def day_of(ts: float) -> int:
    """The day a row is filed under (as the rollups: its hour, ``rollup.hour_of``, // 24)."""
    return int(ts / 3600) // 24


def cells(rows: Iterable[tuple[float, str | None, int | None]]) -> dict[tuple[int, str], list[int]]:
    """(ts, conversation, cost in 1e-10 USD) rows -> the running sums they add, per (span,
    conversation). Rows without a conversation add nothing; a conversation with only unpriced
    or zero-cost rows still gets its row (so it is a candidate)."""
    out: dict[tuple[int, str], list[int]] = {}
    for ts, conversation, cost in rows:
        if conversation is None:
            continue
        day = day_of(ts)
        positive = cost if cost is not None and cost > 0 else 0
        last = day // STEP
        for span in (last - 1, last):
            if span < 0:
                continue
            sums = out.get((span, conversation))
            if sums is None:
                sums = out[(span, conversation)] = [0] * WIDTH
            if positive:
                for i in range(day - STEP * span, WIDTH):
                    sums[i] += positive
    return out


def params(found: dict[tuple[int, str], list[int]]) -> list[tuple[Any, ...]]:
    """Upsert parameters in a fixed (sorted) order: concurrent writers lock rows alike."""
    return [(span, conversation, *found[(span, conversation)]) for span, conversation in sorted(found)]


def backfill_sql(dialect: str, through: bool) -> list[str]:
    """Fill the table from the raw rows (``through``: only ``id <= ?``), both spans of each."""
    if dialect == "sqlite":
        day, cost = "CAST(ts / 3600 AS INTEGER) / 24", "cost_e10"
    else:
        day, cost = "CAST(floor(ts / 3600) AS BIGINT) / 24", "CAST(round(cost_usd * 10000000000) AS BIGINT)"
    limit = " AND id <= ?" if through else ""
    sums = ", ".join(f"SUM(CASE WHEN off <= {i} THEN pos ELSE 0 END)" for i in range(WIDTH))
    out = []
    for back in (0, 1):
        out.append(
            f"INSERT INTO {SPAN_TABLE} (span, conversation, {', '.join(COLS)}) "
            f"SELECT span, conversation, {sums} FROM (SELECT day / {STEP} - {back} AS span, "
            f"day - {STEP} * (day / {STEP} - {back}) AS off, conversation, pos FROM (SELECT {day} AS day, "
            f"conversation, CASE WHEN {cost} > 0 THEN {cost} ELSE 0 END AS pos FROM {TABLE} "
            f"WHERE conversation IS NOT NULL{limit}) AS r) AS u WHERE span >= 0 GROUP BY span, conversation "
            f"ON CONFLICT (span, conversation) DO UPDATE SET {_SETS}"
        )
    return out


def kept_sql(on: bool) -> str:
    return f"UPDATE {ROLLUP_MARK} SET spans = {1 if on else 0}"


STALE_SQL: Final = f"UPDATE {ROLLUP_MARK} SET spans = 0 WHERE spans = 1"


def _e10(value: Any, dialect: str) -> int | None:
    if value is None:
        return None
    if dialect == "sqlite":
        return int(value)
    return int(Decimal(value).scaleb(10).to_integral_value())


def top(db: Any, since: float | None, until: float | None, n: int) -> list[str] | None:
    """The ``n`` most expensive conversations of ``since <= ts < until`` (``query.LedgerDb``
    ``db`` with spans kept), exactly as the plain ranking orders them; None when the spans
    cannot answer (no spans, an open or longer window, too many candidates to settle)."""
    if not getattr(db, "spans", False) or since is None or n <= 0 or since < 0:
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
        candidates = sorted({str(r[0]) for r in got[:k]} | recent)
        ranked = _exact(db, since, until, candidates)
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


def _exact(db: Any, since: float, until: float, candidates: Sequence[str]) -> list[tuple[str, int | None]]:
    """The candidates' exact sums in the window, in the plain ranking's order."""
    if not candidates:
        return []
    marks = ", ".join("?" for _ in candidates)
    rows = db.rows(
        f"SELECT conversation, SUM({db.cost}) FROM {TABLE} WHERE ts >= ? AND ts < ? "
        f"AND conversation IN ({marks}) GROUP BY 1",
        (since, until, *candidates),
    )
    sums = [(str(r[0]), _e10(r[1], db.dialect)) for r in rows]
    sums.sort(key=lambda cs: (cs[1] is None, -(cs[1] or 0), cs[0]))
    return sums
