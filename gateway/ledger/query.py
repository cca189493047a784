"""Read-only access to either ledger store for reports: one connection, one SQL dialect.

SQL is written once with ``?`` placeholders and the dialect's expressions for money sums and
time buckets; ``LedgerDb`` runs it on SQLite (exact INTEGER sums of 1e-10 USD units) or on
PostgreSQL (exact NUMERIC sums). Money leaves as ``Decimal`` quantized to 1e-10 USD.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from gateway.core.errors import ServiceUnavailableError
from gateway.ledger.pg import pg_connect
from gateway.ledger.pricing import quantize_usd
from gateway.ledger.schema import SCHEMA_VERSION, TABLE
from gateway.ledger.sqlite import BUSY_TIMEOUT_MS, is_postgres_url, ledger_path, migrate

Dialect = Literal["sqlite", "postgres"]
Scope = Literal["key", "tenant", "route"]
ZERO: Final = Decimal("0E-10")
CACHE_LABEL: Final = "(cache)"  # cache hits have no served model/provider
GROUP_SQL: Final[dict[str, str]] = {
    "model": f"COALESCE(served_model, CASE WHEN cache_status = 'hit' THEN '{CACHE_LABEL}' END)",
    "route": "route",
    "tenant": "tenant",
    "provider": f"COALESCE(provider, CASE WHEN cache_status = 'hit' THEN '{CACHE_LABEL}' END)",
    "key": "key_id",
    "cause": "savings_cause",
    "none": "'all'",
}
SCOPE_COLUMN: Final[dict[str, str]] = {"key": "key_id", "tenant": "tenant", "route": "route"}
_BUCKET_SECONDS: Final = {"hour": 3600, "day": 86400}
_BUCKET_FORMAT: Final = {"hour": "%Y-%m-%dT%H:00:00Z", "day": "%Y-%m-%d"}


class LedgerUnavailable(ServiceUnavailableError):
    """The ledger database could not be reached (PostgreSQL down, bad URL, no psycopg)."""

    code = "ledger_unavailable"


@dataclass(frozen=True, slots=True)
class Window:
    """Rows with ``since <= ts < until`` (unix seconds; None: unbounded), of one tenant."""

    since: float | None = None
    until: float | None = None
    tenant: str | None = None

    def where(self) -> tuple[str, tuple[Any, ...]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.since is not None:
            clauses.append("ts >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            params.append(self.until)
        if self.tenant is not None:
            clauses.append("tenant = ?")
            params.append(self.tenant)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)


class LedgerDb:
    """One open ledger connection (see ``open_db``)."""

    def __init__(self, dialect: Dialect, conn: Any) -> None:
        self.dialect = dialect
        self.conn = conn

    # -- dialect pieces --------------------------------------------------------------------
    def group_sql(self, group: str) -> str:
        """The grouping expression. On SQLite a plain column gets a unary ``+``: without it the
        planner walks a whole (column, ts) index to skip the GROUP BY sort, reading every row
        ever written where the ts index finds one day's rows directly."""
        sql = GROUP_SQL[group]
        if self.dialect == "sqlite" and sql.isidentifier():
            return "+" + sql
        return sql

    @property
    def cost(self) -> str:
        return "cost_e10" if self.dialect == "sqlite" else "cost_usd"

    @property
    def baseline(self) -> str:
        return "baseline_e10" if self.dialect == "sqlite" else "baseline_cost_usd"

    def bucket_sql(self, bucket: str) -> str:
        if bucket == "none":
            return "'all'"
        if bucket == "month":
            if self.dialect == "sqlite":
                return "strftime('%Y-%m', ts, 'unixepoch')"
            return "to_char(to_timestamp(ts) AT TIME ZONE 'UTC', 'YYYY-MM')"
        seconds = _BUCKET_SECONDS[bucket]
        if self.dialect == "sqlite":
            return f"CAST(ts / {seconds} AS INTEGER)"
        return f"CAST(floor(ts / {seconds}) AS BIGINT)"

    @staticmethod
    def bucket_label(bucket: str, value: Any) -> str:
        if bucket in _BUCKET_SECONDS:
            ts = int(value) * _BUCKET_SECONDS[bucket]
            return datetime.fromtimestamp(ts, UTC).strftime(_BUCKET_FORMAT[bucket])
        return str(value)

    def money(self, value: Any) -> Decimal:
        """A SUM of money as Decimal USD (None: 0)."""
        if value is None:
            return ZERO
        if self.dialect == "sqlite":
            return quantize_usd(Decimal(int(value)).scaleb(-10))
        return quantize_usd(Decimal(value))

    # -- running ---------------------------------------------------------------------------
    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.dialect == "postgres":
            with self.conn.cursor() as cur:
                cur.execute(sql.replace("?", "%s"), tuple(params))
                return list(cur.fetchall())
        return list(self.conn.execute(sql, tuple(params)).fetchall())


def _sqlite_ready(conn: sqlite3.Connection) -> bool:
    """The ledger table exists (migrated to the current version, if it was older)."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if not found:
        return False
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    if row is None or row[0] is None or int(row[0]) < SCHEMA_VERSION:
        conn.isolation_level = None
        migrate(conn)
    return True


@contextmanager
def open_db(url: str | Path) -> Iterator[LedgerDb | None]:
    """A ``LedgerDb`` for ``url`` (SQLite path/URL or postgresql://), or None when the ledger
    does not exist yet (a report never creates one)."""
    if is_postgres_url(url):
        try:
            pg = pg_connect(str(url).strip())
        except Exception as exc:  # psycopg.Error, or psycopg missing
            raise LedgerUnavailable(f"cannot connect to the PostgreSQL ledger: {exc}") from None
        try:
            with pg.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)", (TABLE,))
                found = cur.fetchone()
            pg.rollback()
            yield LedgerDb("postgres", pg) if found and found[0] is not None else None
        finally:
            pg.close()
        return
    path = ledger_path(url)
    if not path.is_file():
        yield None
        return
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        yield LedgerDb("sqlite", conn) if _sqlite_ready(conn) else None
    finally:
        conn.close()


def _check_scope(scope: str) -> str:
    if scope not in SCOPE_COLUMN:
        raise ValueError(f"bad scope {scope!r}: expected one of {', '.join(SCOPE_COLUMN)}")
    return SCOPE_COLUMN[scope]


def spent_since(url: str | Path, scope: str, since_ts: float) -> dict[str, Decimal]:
    """USD spent per key/tenant/route name since ``since_ts`` (seeds the budgets)."""
    column = _check_scope(scope)
    with open_db(url) as db:
        if db is None:
            return {}
        grouped = db.group_sql(scope)  # the same column, planner-friendly on SQLite
        sql = f"SELECT {grouped}, SUM({db.cost}) FROM {TABLE} WHERE ts >= ? AND {column} IS NOT NULL"
        sql += " GROUP BY 1"
        return {str(r[0]): db.money(r[1]) for r in db.rows(sql, (since_ts,))}


def spent_by(url: str | Path, scope: Scope, name: str, since_ts: float) -> Decimal:
    """USD spent by one key/tenant/route since ``since_ts``."""
    column = _check_scope(scope)
    with open_db(url) as db:
        if db is None:
            return ZERO
        sql = f"SELECT SUM({db.cost}) FROM {TABLE} WHERE {column} = ? AND ts >= ?"
        found = db.rows(sql, (name, since_ts))
        return db.money(found[0][0] if found else None)
