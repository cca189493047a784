"""Conversation spans (schema v8, opt-in: ``SWITCHYARD_CONVERSATION_SPANS=1``): what lets
``conversations.top`` rank a window of up to 32 days from one row per conversation.

``ledger_conversation_span`` holds, per span and conversation, ``c0`` .. ``c63``: running sums
of the positive part of the conversation's cost (integer 1e-10 USD) over the span's 64 days
(``c{i}``: days 0..i). Spans start every 32 days (span s: days 32s .. 32s + 63), so a row is in
two spans and every window of up to 32 days lies inside one; ``c{b} - c{a-1}`` bounds from above
what a conversation spent on days a..b of its span.

Writes: the SQLite writer adds rows in its deferred roll (``rollup.roll``, the rows after the
rollup mark are read raw by ``conversations.top``); the PostgreSQL shipper in the insert's transaction. Turned
on for an existing ledger, the store back-fills the table once (``enable``); a writer running
without it marks the table stale (``ledger_rollup_mark.spans = 0``) so no report trusts it.
Cost: a wide upsert per row and span (SQLite writer CPU per row 38 -> 53 µs with them on,
``python -m load_tests.ledger_spans_bench``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

from gateway.ledger.schema import ROLLUP_MARK, SPAN_TABLE, TABLE

WIDTH: Final = 64  # days per span
STEP: Final = 32  # days between span starts
COLS: Final = tuple(f"c{i}" for i in range(WIDTH))

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


def day_start(day: int) -> float:
    """The least ``ts`` that ``day_of`` files under ``day`` or later (``ts / 3600`` rounds, so
    it may lie a hair before ``day * 86400``): rows of ``day`` are exactly ``day_start(day) <=
    ts < day_start(day + 1)``, a plain ts range."""
    ts = day * 86_400.0
    while ts > 0 and day_of(math.nextafter(ts, -math.inf)) >= day:
        ts = math.nextafter(ts, -math.inf)
    while day_of(ts) < day:
        ts = math.nextafter(ts, math.inf)
    return ts


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
    """Fill the (empty) table from the raw rows (``through``: only ``id <= ?``): one pass over
    them, both spans of each row in one statement, so no row is written twice (on PostgreSQL
    an update would leave a dead copy of a 66-column row for every conversation)."""
    if dialect == "sqlite":
        day, cost = "CAST(ts / 3600 AS INTEGER) / 24", "cost_e10"
    else:
        day, cost = "CAST(floor(ts / 3600) AS BIGINT) / 24", "CAST(round(cost_usd * 10000000000) AS BIGINT)"
    limit = " AND id <= ?" if through else ""
    sums = ", ".join(f"SUM(CASE WHEN off <= {i} THEN pos ELSE 0 END)" for i in range(WIDTH))
    return [
        f"INSERT INTO {SPAN_TABLE} (span, conversation, {', '.join(COLS)}) "
        f"SELECT span, conversation, {sums} FROM (SELECT day / {STEP} - back AS span, "
        f"day - {STEP} * (day / {STEP} - back) AS off, conversation, pos FROM (SELECT {day} AS day, "
        f"conversation, CASE WHEN {cost} > 0 THEN {cost} ELSE 0 END AS pos FROM {TABLE} "
        f"WHERE conversation IS NOT NULL{limit}) AS r CROSS JOIN (SELECT 0 AS back UNION ALL SELECT 1) AS b) "
        f"AS u WHERE span >= 0 GROUP BY span, conversation "
        f"ON CONFLICT (span, conversation) DO UPDATE SET {_SETS}"
    ]


def kept_sql(on: bool) -> str:
    return f"UPDATE {ROLLUP_MARK} SET spans = {1 if on else 0}"


STALE_SQL: Final = f"UPDATE {ROLLUP_MARK} SET spans = 0 WHERE spans = 1"
