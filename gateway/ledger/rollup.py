"""Write side of the ledger's rollups: what a batch of newly inserted rows adds to
``ledger_rollup_hour`` and ``ledger_rollup_day`` (schema v4), as upserts. The PostgreSQL
shipper runs them in the same transaction as the rows; the SQLite writer commits rows alone
and rolls them up a little later in batches (``roll``, schema v6): the rows after
``ledger_rollup_mark.through`` are not in the rollups yet, and reports read them raw.

A row counts once per dimension (model, route, tenant, provider, key, cause) in its hour
bucket (``trunc(ts / 3600)`` in IEEE double arithmetic, as the SQL of the back-fill and of the
reports computes it) and in its day (hour // 24). Only rows the insert actually inserted may be
added (a replayed request id adds nothing): the callers pass exactly those. Money is summed in
integer units of 1e-10 USD (the ledger's quantum), so no float drift, ever.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from decimal import Decimal
from operator import itemgetter
from typing import Any, Final, NamedTuple

from gateway.ledger import spans as conversation_spans
from gateway.ledger.schema import (
    CACHE_LABEL,
    ROLLUP_DAY,
    ROLLUP_DIMS,
    ROLLUP_HOUR,
    ROLLUP_KEY,
    ROLLUP_MARK,
    ROLLUP_MEASURES,
    SPAN_TABLE,
    SQLITE_COLUMNS,
    TABLE,
)
from gateway.ledger.sqlite import immediate

log = logging.getLogger(__name__)

Cell = tuple[str, int, str, str]  # (dim, bucket, tenant, encoded value)
Sums = list[int]  # ROLLUP_MEASURES, money in 1e-10 USD


class Fact(NamedTuple):
    """What the rollups need of one row (money in integer 1e-10 USD units, None: unknown)."""

    ts: float
    tenant: str
    key_id: str | None
    route: str | None
    served_model: str | None
    provider: str | None
    cache_status: str
    status: str
    input_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    cost_e10: int | None
    baseline_e10: int | None
    savings_cause: str


_FACT_OF: Final = itemgetter(*(SQLITE_COLUMNS.index(name) for name in Fact._fields))


def facts(rows: Iterable[Sequence[Any]]) -> list[Fact]:
    """``Fact``s of rows given as SQLite INSERT parameters (``SQLITE_COLUMNS`` order)."""
    return [Fact._make(_FACT_OF(r)) for r in rows]


def hour_of(ts: float) -> int:
    """The hour bucket of ``ts``: as SQLite's ``CAST(ts / 3600 AS INTEGER)`` (ts >= 0)."""
    return int(ts / 3600)


def encode(value: str | None) -> str:
    """A rollup value: '' for NULL, '=' + the value otherwise."""
    return "" if value is None else "=" + value


def decode(value: str) -> str | None:
    return None if value == "" else value[1:]


def _upsert(table: str, mark: str) -> str:
    cols = (*ROLLUP_KEY, *ROLLUP_MEASURES)
    adds = ", ".join(f"{m} = {table}.{m} + excluded.{m}" for m in ROLLUP_MEASURES)
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(mark for _ in cols)}) "
        f"ON CONFLICT ({', '.join(ROLLUP_KEY)}) DO UPDATE SET {adds}"
    )


SQLITE_UPSERT: Final = {ROLLUP_HOUR: _upsert(ROLLUP_HOUR, "?"), ROLLUP_DAY: _upsert(ROLLUP_DAY, "?")}
POSTGRES_UPSERT: Final = {ROLLUP_HOUR: _upsert(ROLLUP_HOUR, "%s"), ROLLUP_DAY: _upsert(ROLLUP_DAY, "%s")}
_N: Final = len(ROLLUP_MEASURES)


def cells(facts: Iterable[Fact]) -> dict[str, dict[Cell, Sums]]:
    """The sums ``facts`` add, per rollup table and cell. Rows sharing every dimension and the
    hour are summed first, so a batch of similar rows costs one dictionary update each."""
    combos: dict[tuple[int, str, str, str, str, str, str], Sums] = {}
    for f in facts:
        hit = f.cache_status == "hit"
        model = f.served_model if f.served_model is not None else (CACHE_LABEL if hit else None)
        provider = f.provider if f.provider is not None else (CACHE_LABEL if hit else None)
        key = (
            hour_of(f.ts),
            f.tenant,
            encode(model),
            encode(f.route),
            encode(provider),
            encode(f.key_id),
            encode(f.savings_cause),
        )
        cost, base = f.cost_e10, f.baseline_e10
        add = (
            1,
            0 if f.status == "ok" else 1,
            1 if cost is None else 0,
            f.input_tokens or 0,
            f.cached_tokens or 0,
            f.output_tokens or 0,
            cost or 0,
            base or 0,
            base - cost if base is not None and cost is not None else 0,
        )
        sums = combos.get(key)
        if sums is None:
            combos[key] = list(add)
        else:
            for i in range(_N):
                sums[i] += add[i]
    hourly: dict[Cell, Sums] = {}
    daily: dict[Cell, Sums] = {}
    for (hour, tenant, model, route, provider, key_id, cause), sums in combos.items():
        values = (model, route, encode(tenant), provider, key_id, cause)
        for dim, value in zip(ROLLUP_DIMS, values, strict=True):
            for table, bucket in ((hourly, hour), (daily, hour // 24)):
                cell = (dim, bucket, tenant, value)
                have = table.get(cell)
                if have is None:
                    table[cell] = list(sums)
                else:
                    for i in range(_N):
                        have[i] += sums[i]
    return {ROLLUP_HOUR: hourly, ROLLUP_DAY: daily}


def params(
    table_cells: dict[Cell, Sums], money: type[int] | type[Decimal] = int
) -> list[tuple[str | int | Decimal, ...]]:
    """Upsert parameters in a fixed (sorted) order, so concurrent writers lock cells in the
    same order. ``money=Decimal``: the money sums as Decimal USD (PostgreSQL NUMERIC)."""
    out: list[tuple[str | int | Decimal, ...]] = []
    for cell in sorted(table_cells):
        sums = table_cells[cell]
        if money is Decimal:
            out.append((*cell, *sums[:6], *(Decimal(v).scaleb(-10) for v in sums[6:])))
        else:
            out.append((*cell, *sums))
    return out


_TAIL_SQL: Final = (
    f"SELECT id, {', '.join(Fact._fields)}, conversation FROM {TABLE} WHERE id > ? ORDER BY id LIMIT ?"
)
ROLL_LIMIT: Final = 4096  # rows per roll transaction


def mark(conn: sqlite3.Connection) -> int:
    """The id through which the rows are in the rollups (SQLite, schema v6)."""
    row = conn.execute(f"SELECT through FROM {ROLLUP_MARK}").fetchone()
    return int(row[0]) if row else 0


def roll(conn: sqlite3.Connection, limit: int = ROLL_LIMIT, *, spans: bool = False) -> int:
    """Add up to ``limit`` rows after the mark to the rollups (``spans``: and to the
    conversation spans, else mark those stale) and move the mark past them, in the caller's
    write transaction (so two writers never roll the same row). Returns how many rows it
    rolled up (fewer than ``limit``: none are left)."""
    through = mark(conn)
    tail = conn.execute(_TAIL_SQL, (through, limit)).fetchall()
    if not tail:
        return 0
    facts = [Fact._make(r[1:-1]) for r in tail]
    for table, table_cells in cells(facts).items():
        conn.executemany(SQLITE_UPSERT[table], params(table_cells))
    if spans:
        found = conversation_spans.cells((f.ts, r[-1], f.cost_e10) for f, r in zip(facts, tail, strict=True))
        conn.executemany(conversation_spans.UPSERT["sqlite"], conversation_spans.params(found))
    else:
        conn.execute(conversation_spans.STALE_SQL)
    conn.execute(f"UPDATE {ROLLUP_MARK} SET through = ?", (tail[-1][0],))
    return len(tail)


def sync_spans(conn: sqlite3.Connection, keep: bool) -> None:
    """At a writer's start-up: the conversation spans in line with ``keep`` (SQLite). Turned
    on, a ledger without them is rolled up and back-filled once (minutes for tens of millions
    of rows); turned off, they are emptied and marked stale. One write transaction."""
    with immediate(conn):
        (kept,) = conn.execute(f"SELECT spans FROM {ROLLUP_MARK}").fetchone()
        if bool(kept) == keep:
            return
        while roll(conn, spans=bool(kept)) == ROLL_LIMIT:
            pass
        conn.execute(f"DELETE FROM {SPAN_TABLE}")
        if keep:
            log.info("ledger: building the conversation spans from the rows (once)")
            for stmt in conversation_spans.backfill_sql("sqlite", through=True):
                conn.execute(stmt, (mark(conn),))
        conn.execute(conversation_spans.kept_sql(keep))
