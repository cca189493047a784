"""The one ledger schema, as versioned migrations for SQLite and PostgreSQL.

Both stores keep the same columns (``LedgerRow``'s fields) and the same indexes under the same
version numbers, recorded in ``schema_migrations``. Money is exact in both: PostgreSQL as
``NUMERIC(38, 10)``; SQLite as the Decimal string (``cost_usd``) plus an INTEGER copy in units
of 1e-10 USD (``cost_e10``) that SQL can sum exactly and fast.

  v1  the table; indexes on ts, (tenant, ts), (served_model, ts)
  v2  savings_cause, route_decision; request_id UNIQUE (idempotent inserts, duplicates from
      before v2 are dropped, the first kept); indexes on (key_id, ts), (route, ts),
      (tenant, served_model, ts); SQLite: cost_e10/baseline_e10 (back-filled)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final, Protocol

from gateway.core.ledger_row import LedgerRow

TABLE: Final = "ledger"
SCHEMA_VERSION: Final = 2
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
}

POSTGRES_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: _v1("NUMERIC(38, 10)", "DOUBLE PRECISION", "BIGSERIAL PRIMARY KEY"),
    2: (
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS savings_cause TEXT NOT NULL DEFAULT 'none'",
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS route_decision TEXT",
        *_V2_COMMON,
    ),
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
