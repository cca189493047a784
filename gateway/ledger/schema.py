"""The one ledger schema, as versioned migrations for SQLite and PostgreSQL.

Both stores keep the same columns (``LedgerRow``'s fields) and the same indexes under the same
version numbers, recorded in ``schema_migrations``. Money is exact in both: PostgreSQL as
``NUMERIC(38, 10)``; SQLite as the Decimal string (``cost_usd``) plus an INTEGER copy in units
of 1e-10 USD (``cost_e10``) that SQL can sum exactly and fast.

  v1  the table; indexes on ts, (tenant, ts), (served_model, ts)
  v2  savings_cause, route_decision; request_id UNIQUE (idempotent inserts, duplicates from
      before v2 are dropped, the first kept); indexes on (key_id, ts), (route, ts),
      (tenant, served_model, ts); SQLite: cost_e10/baseline_e10 (back-filled)
  v3  conversation (a short non-secret id, see ``core.ledger_row.conversation_id``); index on
      (conversation, ts); old rows keep NULL
  v4  the rollups ``ledger_rollup_hour`` and ``ledger_rollup_day`` (see ``rollup``): per time
      bucket, dimension (model, route, tenant, provider, key, cause), tenant and value, the
      sums a report needs, money exact (SQLite: INTEGER 1e-10 USD; PostgreSQL: NUMERIC);
      back-filled from the existing rows, then kept by the writers in the insert's transaction
  v5  the ts index covers the conversation top-N: SQLite (ts, conversation, cost_e10),
      PostgreSQL (ts) INCLUDE (conversation, cost_usd), replacing the plain ts index (still
      every ts range's index; no more indexes to keep per insert): the most expensive
      conversations of a window are picked from the index alone (``conversations.plain``)
  v6  SQLite: ``ledger_rollup_mark``, the id through which the rows are in the rollups. The
      writer commits rows alone and adds them to the rollups a little later, in batches
      (``rollup.roll``); a report adds the rows after the mark from the raw table, so it stays
      exact (``query.grouped``). PostgreSQL: nothing (its shipper keeps the rollups in the
      insert's transaction); the version number is kept the same on both stores
  v7  the (tenant, ts), (served_model, ts), (key_id, ts), (route, ts) and (tenant, served_model,
      ts) indexes dropped on both stores: every report reads the rollups, the edge hours through
      the ts index and (SQLite) the rows after the mark by id, so no query walks them any more,
      and each cost every insert a B-tree update (a one-row SQLite commit 70 -> 40 µs CPU)
  v8  ``ledger_conversation_span`` (see ``spans``: per 64-day span and conversation, running
      sums of its cost per day; kept only with ``SWITCHYARD_CONVERSATION_SPANS=1``, back-filled
      when first turned on) and ``ledger_rollup_mark.spans`` (1: the table is complete and
      kept); PostgreSQL gets the mark table here, for that flag alone
  v9  the (conversation, ts) index covers the cost (SQLite (conversation, ts, cost_e10),
      PostgreSQL INCLUDE (cost_usd)), replacing it: the spans' exact sums of their candidates
      read the index alone; PostgreSQL: the spans' table leaves a fifth of each page free
      (``fillfactor = 80``) so the shipper's upserts stay on their page (HOT updates)
  v10 the ts index covers the tenant too (SQLite (ts, conversation, cost_e10, tenant),
      PostgreSQL (ts) INCLUDE (conversation, cost_usd, tenant)), replacing v5's: a tenant's
      top conversations (which the spans do not serve) and its reports' edge rows read the
      index alone instead of looking up every row of the window; no more indexes per insert
  v11 ``stored_responses`` (PostgreSQL: the Responses API's stored responses, created at
      start-up under the migrations' lock; SQLite keeps them in their own file: a no-op)
  v12 ``batch_id`` (the batch a row was an item of; NULL otherwise), ``compressed_tokens`` (the
      prompt tokens the compression step saved; NULL where it is off) and the Batch API's state:
      ``batches`` (one row per batch: tenant, key, protocol, endpoint, status, times, files,
      and errors) and ``batch_items`` (one row per input line: its body, status,
      attempts, and once run its result and ledger row, committed together; see
      ``ledger/batches.py``)
  v13 ``task`` (``RequestRecord.task()``: the x-switchyard-task header or a fingerprint of the
      system prompt and tool names; old rows keep NULL) and ``ledger_feedback`` (per served
      request id: the tenant that owns it, a score in [0, 1], when and from where: ``api`` or
      ``import``), joined to the ledger by request id for quality per route, task and model
      (``ledger.feedback``) and the learned routes' estimates
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final, Protocol

from gateway.core.ledger_row import LedgerRow

TABLE: Final = "ledger"
SCHEMA_VERSION: Final = 14
COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(LedgerRow))
SQLITE_COLUMNS: Final = (*COLUMNS, "cost_e10", "baseline_e10")


def _v1(money: str, real: str, serial: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id {serial},
        request_id TEXT NOT NULL,
        ts {real} NOT NULL,
        tenant TEXT NOT NULL,
        key_id TEXT,
        route TEXT,
        requested_model TEXT NOT NULL,
        served_model TEXT,
        provider TEXT,
        endpoint TEXT NOT NULL,
        stream INTEGER NOT NULL,
        cache_status TEXT NOT NULL,
        input_tokens INTEGER,
        cached_tokens INTEGER,
        cache_write_tokens INTEGER,
        output_tokens INTEGER,
        usage_estimated INTEGER NOT NULL,
        cost_usd {money},
        baseline_cost_usd {money},
        latency_ms {real} NOT NULL,
        ttft_ms {real},
        status TEXT NOT NULL,
        http_status INTEGER NOT NULL,
        error_code TEXT,
        attempts INTEGER NOT NULL,
        classifier_score {real}
    )""",
        f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_ts ON {TABLE} (ts)",
        f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_tenant_ts ON {TABLE} (tenant, ts)",
        f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_served_model_ts ON {TABLE} (served_model, ts)",
    )


_V2_COMMON: Final = (
    f"DELETE FROM {TABLE} WHERE id NOT IN (SELECT MIN(id) FROM {TABLE} GROUP BY request_id)",
    f"CREATE UNIQUE INDEX IF NOT EXISTS ux_{TABLE}_request_id ON {TABLE} (request_id)",
    f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_key_ts ON {TABLE} (key_id, ts)",
    f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_route_ts ON {TABLE} (route, ts)",
    f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_tenant_model_ts ON {TABLE} (tenant, served_model, ts)",
)

_V3: Final = (
    f"ALTER TABLE {TABLE} ADD COLUMN conversation TEXT",
    f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_conversation_ts ON {TABLE} (conversation, ts)",
)

# -- v4: rollups --------------------------------------------------------------------------
ROLLUP_HOUR: Final = f"{TABLE}_rollup_hour"
ROLLUP_DAY: Final = f"{TABLE}_rollup_day"
ROLLUP_DIMS: Final[tuple[str, ...]] = ("model", "route", "tenant", "provider", "key", "cause")
CACHE_LABEL: Final = "(cache)"  # cache hits have no served model/provider
# The value of each dimension over a raw row (the reports' grouping expressions).
DIM_SQL: Final[dict[str, str]] = {
    "model": f"COALESCE(served_model, CASE WHEN cache_status = 'hit' THEN '{CACHE_LABEL}' END)",
    "route": "route",
    "tenant": "tenant",
    "provider": f"COALESCE(provider, CASE WHEN cache_status = 'hit' THEN '{CACHE_LABEL}' END)",
    "key": "key_id",
    "cause": "savings_cause",
}
# A rollup value is '' for NULL and '=' + the value otherwise (so '' stays distinct from NULL).
ROLLUP_MEASURES: Final[tuple[str, ...]] = (
    "requests",
    "errors",
    "unpriced",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "cost",
    "baseline",
    "savings",
)
ROLLUP_KEY: Final[tuple[str, ...]] = ("dim", "bucket", "tenant", "value")
ROLLUP_MARK: Final = f"{TABLE}_rollup_mark"  # v6 (SQLite): rows with id <= through are rolled up


def _rollup_tables(integer: str, money: str, suffix: str) -> tuple[str, ...]:
    cols = ", ".join(
        f"{m} {money if m in ('cost', 'baseline', 'savings') else integer} NOT NULL" for m in ROLLUP_MEASURES
    )
    return tuple(
        f"CREATE TABLE IF NOT EXISTS {name} (dim TEXT NOT NULL, bucket {integer} NOT NULL, "
        f"tenant TEXT NOT NULL, value TEXT NOT NULL, {cols}, PRIMARY KEY ({', '.join(ROLLUP_KEY)})){suffix}"
        for name in (ROLLUP_HOUR, ROLLUP_DAY)
    )


def _backfill(hour: str, cost: str, baseline: str) -> tuple[str, ...]:
    """Fill the rollups from the raw rows (``hour``: the dialect's hour bucket of ``ts``)."""
    sums = (
        "COUNT(*), SUM(CASE WHEN status = 'ok' THEN 0 ELSE 1 END), "
        f"SUM(CASE WHEN {cost} IS NULL THEN 1 ELSE 0 END), COALESCE(SUM(input_tokens), 0), "
        "COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(output_tokens), 0), "
        f"COALESCE(SUM({cost}), 0), COALESCE(SUM({baseline}), 0), COALESCE(SUM({baseline} - {cost}), 0)"
    )
    cols = ", ".join((*ROLLUP_KEY, *ROLLUP_MEASURES))
    stmts = [
        f"INSERT INTO {ROLLUP_HOUR} ({cols}) SELECT '{dim}', {hour}, tenant, COALESCE('=' || {expr}, ''), "
        f"{sums} FROM {TABLE} GROUP BY 2, 3, 4"
        for dim, expr in DIM_SQL.items()
    ]
    day_sums = ", ".join(f"SUM({m})" for m in ROLLUP_MEASURES)
    stmts.append(
        f"INSERT INTO {ROLLUP_DAY} ({cols}) SELECT dim, bucket / 24, tenant, value, {day_sums} "
        f"FROM {ROLLUP_HOUR} GROUP BY 1, 2, 3, 4"
    )
    return tuple(stmts)


# The hour bucket of a row: trunc(ts / 3600) in IEEE double arithmetic, as ``rollup.hour_of``.
SQLITE_HOUR_SQL: Final = "CAST(ts / 3600 AS INTEGER)"
POSTGRES_HOUR_SQL: Final = "CAST(floor(ts / 3600) AS BIGINT)"

TS_INDEX: Final = f"ix_{TABLE}_ts_conversation"
DROPPED_V7: Final = tuple(
    f"ix_{TABLE}_{name}" for name in ("tenant_ts", "served_model_ts", "key_ts", "route_ts", "tenant_model_ts")
)
_V7: Final = tuple(f"DROP INDEX IF EXISTS {name}" for name in DROPPED_V7)
SPAN_TABLE: Final = f"{TABLE}_conversation_span"
_SPAN_COLS: Final = ", ".join(f"c{i} {{integer}} NOT NULL" for i in range(64))


def _span_table(integer: str, suffix: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {SPAN_TABLE} (span {integer} NOT NULL, conversation TEXT NOT NULL, "
        f"{_SPAN_COLS.format(integer=integer)}, PRIMARY KEY (span, conversation)){suffix}"
    )


CONVERSATION_INDEX: Final = f"ix_{TABLE}_conversation_ts_cost"


def _v9(covering: str) -> tuple[str, ...]:
    return (
        f"CREATE INDEX IF NOT EXISTS {CONVERSATION_INDEX} ON {TABLE} {covering}",
        f"DROP INDEX IF EXISTS ix_{TABLE}_conversation_ts",
    )


def _v5(covering: str) -> tuple[str, ...]:
    return (
        f"CREATE INDEX IF NOT EXISTS {TS_INDEX} ON {TABLE} {covering}",
        f"DROP INDEX IF EXISTS ix_{TABLE}_ts",
    )


TS_TENANT_INDEX: Final = f"ix_{TABLE}_ts_conversation_tenant"


def _v10(covering: str) -> tuple[str, ...]:
    return (
        f"CREATE INDEX IF NOT EXISTS {TS_TENANT_INDEX} ON {TABLE} {covering}",
        f"DROP INDEX IF EXISTS {TS_INDEX}",
    )


def stored_responses_sql(real: str, blob: str) -> tuple[str, ...]:
    """The Responses API's stored responses (ledger/responses.py): its own file on SQLite,
    a migration of the shared database on PostgreSQL (replicas starting together)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS stored_responses (
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    previous_id TEXT,
    created_at {real} NOT NULL,
    expires_at {real} NOT NULL,
    response {blob} NOT NULL,
    input_items {blob} NOT NULL,
    PRIMARY KEY (tenant, id)
)""",
        "CREATE INDEX IF NOT EXISTS stored_responses_expiry ON stored_responses (expires_at)",
    )


BATCHES: Final = "batches"
BATCH_ITEMS: Final = "batch_items"


def _v12(real: str, blob: str, add_column: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE {TABLE} ADD COLUMN {add_column}batch_id TEXT",
        f"ALTER TABLE {TABLE} ADD COLUMN {add_column}compressed_tokens INTEGER",
        f"""CREATE TABLE IF NOT EXISTS {BATCHES} (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        key_id TEXT,
        api TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        model TEXT,
        input_file_id TEXT,
        completion_window TEXT NOT NULL,
        metadata {blob},
        status TEXT NOT NULL,
        created_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        times {blob} NOT NULL,
        output_file_id TEXT,
        error_file_id TEXT,
        errors {blob},
        upstream {blob}
    )""",
        f"CREATE INDEX IF NOT EXISTS ix_{BATCHES}_tenant_created ON {BATCHES} (tenant, created_at)",
        f"CREATE INDEX IF NOT EXISTS ix_{BATCHES}_status ON {BATCHES} (status)",
        f"""CREATE TABLE IF NOT EXISTS {BATCH_ITEMS} (
        batch_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        custom_id TEXT,
        body {blob},
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        lease_until {real},
        result {blob},
        ledger_row {blob},
        billed INTEGER NOT NULL,
        PRIMARY KEY (batch_id, idx)
    )""",
        f"CREATE INDEX IF NOT EXISTS ix_{BATCH_ITEMS}_status ON {BATCH_ITEMS} (status, batch_id, idx)",
    )


FEEDBACK_TABLE: Final = f"{TABLE}_feedback"


def _v13(real: str, if_not: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE {TABLE} ADD COLUMN {if_not}task TEXT",
        f"CREATE TABLE IF NOT EXISTS {FEEDBACK_TABLE} (request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
        f"score {real} NOT NULL, ts {real} NOT NULL, source TEXT NOT NULL)",
    )


FILES_TABLE: Final = "batch_files"


def _v14_postgres() -> tuple[str, ...]:
    """The Files API's files, shared by replicas (ledger/batch_files_pg.py; on SQLite a single
    process keeps them in a local directory)."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {FILES_TABLE} (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        purpose TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        meta BYTEA NOT NULL,
        data BYTEA NOT NULL,
        PRIMARY KEY (tenant, id)
    )""",
        f"CREATE INDEX IF NOT EXISTS ix_{FILES_TABLE}_tenant_created ON {FILES_TABLE} (tenant, created_at)",
    )


SQLITE_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: _v1("TEXT", "REAL", "INTEGER PRIMARY KEY"),
    2: (
        f"ALTER TABLE {TABLE} ADD COLUMN savings_cause TEXT NOT NULL DEFAULT 'none'",
        f"ALTER TABLE {TABLE} ADD COLUMN route_decision TEXT",
        f"ALTER TABLE {TABLE} ADD COLUMN cost_e10 INTEGER",
        f"ALTER TABLE {TABLE} ADD COLUMN baseline_e10 INTEGER",
        # sy_e10: a function the migration registers (exact Decimal string -> 1e-10 units)
        f"UPDATE {TABLE} SET cost_e10 = sy_e10(cost_usd), baseline_e10 = sy_e10(baseline_cost_usd)",
        *_V2_COMMON,
    ),
    3: _V3,
    4: (
        *_rollup_tables("INTEGER", "INTEGER", " WITHOUT ROWID"),
        *_backfill(SQLITE_HOUR_SQL, "cost_e10", "baseline_e10"),
    ),
    5: _v5("(ts, conversation, cost_e10)"),
    6: (
        f"CREATE TABLE IF NOT EXISTS {ROLLUP_MARK} (one INTEGER PRIMARY KEY CHECK (one = 1), "
        "through INTEGER NOT NULL)",
        f"INSERT INTO {ROLLUP_MARK} (one, through) SELECT 1, COALESCE(MAX(id), 0) FROM {TABLE}",
    ),
    7: _V7,
    8: (
        _span_table("INTEGER", " WITHOUT ROWID"),
        f"ALTER TABLE {ROLLUP_MARK} ADD COLUMN spans INTEGER NOT NULL DEFAULT 0",
    ),
    9: _v9("(conversation, ts, cost_e10)"),
    10: _v10("(ts, conversation, cost_e10, tenant)"),
    11: (),  # stored responses: their own file on SQLite (ledger/responses.py)
    12: _v12("REAL", "BLOB", ""),
    13: _v13("REAL", ""),
    14: (),  # the Files API's files: a local directory (ledger/batch_files.py)
}

POSTGRES_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: _v1("NUMERIC(38, 10)", "DOUBLE PRECISION", "BIGSERIAL PRIMARY KEY"),
    2: (
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS savings_cause TEXT NOT NULL DEFAULT 'none'",
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS route_decision TEXT",
        *_V2_COMMON,
    ),
    3: (
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS conversation TEXT",
        f"CREATE INDEX IF NOT EXISTS ix_{TABLE}_conversation_ts ON {TABLE} (conversation, ts)",
    ),
    4: (
        *_rollup_tables("BIGINT", "NUMERIC(38, 10)", ""),
        *_backfill(POSTGRES_HOUR_SQL, "cost_usd", "baseline_cost_usd"),
    ),
    5: _v5("(ts) INCLUDE (conversation, cost_usd)"),
    6: (),  # the rollups stay in the insert's transaction (see v6 above)
    7: _V7,
    8: (
        _span_table("BIGINT", ""),
        f"CREATE TABLE IF NOT EXISTS {ROLLUP_MARK} (one INTEGER PRIMARY KEY CHECK (one = 1), "
        "through BIGINT NOT NULL, spans INTEGER NOT NULL DEFAULT 0)",
        f"INSERT INTO {ROLLUP_MARK} (one, through, spans) VALUES (1, 0, 0) ON CONFLICT (one) DO NOTHING",
    ),
    9: (*_v9("(conversation, ts) INCLUDE (cost_usd)"), f"ALTER TABLE {SPAN_TABLE} SET (fillfactor = 80)"),
    10: _v10("(ts) INCLUDE (conversation, cost_usd, tenant)"),
    11: stored_responses_sql("DOUBLE PRECISION", "BYTEA"),
    12: _v12("DOUBLE PRECISION", "BYTEA", "IF NOT EXISTS "),
    13: _v13("DOUBLE PRECISION", "IF NOT EXISTS "),
    14: _v14_postgres(),
}

MIGRATIONS_TABLE_SQL: Final = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
)
SQLITE_INSERT_SQL: Final = (
    f"INSERT INTO {TABLE} ({', '.join(SQLITE_COLUMNS)}) VALUES ({', '.join('?' for _ in SQLITE_COLUMNS)}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
POSTGRES_INSERT_SQL: Final = (
    f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('%s' for _ in COLUMNS)}) "
    "ON CONFLICT (request_id) DO NOTHING"
)


class Execute(Protocol):
    """Runs one statement (``sqlite3.Connection.execute``, ``psycopg.Cursor.execute``)."""

    def __call__(self, sql: str, params: tuple[Any, ...] = ..., /) -> Any: ...


def apply_migrations(execute: Execute, migrations: Mapping[int, tuple[str, ...]], placeholder: str) -> int:
    """Apply the ``migrations`` newer than the version ``schema_migrations`` records, in the
    caller's transaction; ``placeholder`` is the dialect's parameter mark (``?``, ``%s``).
    Returns the version reached."""
    execute(MIGRATIONS_TABLE_SQL)
    row = execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    current = int(row[0]) if row and row[0] is not None else 0
    record = f"INSERT INTO schema_migrations (version, applied_at) VALUES ({placeholder}, {placeholder})"
    for version in sorted(v for v in migrations if v > current):
        for stmt in migrations[version]:
            execute(stmt)
        execute(record, (version, time.time()))
        current = version
    return current
