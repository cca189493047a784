"""One read-only ledger connection for reports, on either store, and the SQL dialect pieces.

``open_db`` opens a SQLite file or takes a reused PostgreSQL report connection
(``pg.ReportConnections``), both one read snapshot per report (the rollup mark, the rollups, the
spans and the raw rows agree); ``LedgerDb`` runs ``?``-placeholder SQL on it and supplies the
dialect's expressions for money sums (exact INTEGER 1e-10 USD units on SQLite, NUMERIC on
PostgreSQL) and time buckets. Money leaves as ``Decimal`` quantized to 1e-10 USD.
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
from gateway.ledger.pg import REPORT_CONNECTIONS
from gateway.ledger.pricing import quantize_usd
from gateway.ledger.rollup import mark
from gateway.ledger.schema import (
    DIM_SQL,
    POSTGRES_HOUR_SQL,
    ROLLUP_MARK,
    SCHEMA_VERSION,
    SQLITE_HOUR_SQL,
    TABLE,
)
from gateway.ledger.sqlite import BUSY_TIMEOUT_MS, is_postgres_url, ledger_path, migrate

Dialect = Literal["sqlite", "postgres"]
ZERO: Final = Decimal("0E-10")
# Grouped from the raw rows only (no rollup keeps them): conversations, and the error code (a
# failed row without one, such as a client gone, by its status; a row served well: none).
RAW_GROUPS: Final = ("conversation", "error", "task")
_ERROR_SQL: Final = "COALESCE(error_code, CASE WHEN status = 'ok' THEN NULL ELSE status END)"
GROUP_SQL: Final[dict[str, str]] = {
    **DIM_SQL, "conversation": "conversation", "error": _ERROR_SQL, "task": "task", "none": "'all'"
}  # fmt: skip
ROLLUP_ROWS_VERSION: Final = 4  # the schema version that brought the rollups
SPANS_VERSION: Final = 8  # ... and the conversation spans
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

    def __init__(
        self,
        dialect: Dialect,
        conn: Any,
        *,
        rollups: bool = False,
        rolled_through: int | None = None,
        spans: bool = False,
    ) -> None:
        self.dialect = dialect
        self.conn = conn
        self.rollups = rollups  # the rollup tables exist and are kept (schema v4)
        self.rolled_through = rolled_through  # SQLite v6: rows after this id are not rolled up yet
        self.spans = spans  # v8: the conversation spans are complete and kept (``conversations.top``)

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

    def bucket_sql(self, bucket: str, ts: str = "ts") -> str:
        if bucket == "none":
            return "'all'"
        if bucket == "month":
            if self.dialect == "sqlite":
                return f"strftime('%Y-%m', {ts}, 'unixepoch')"
            return f"to_char(to_timestamp({ts}) AT TIME ZONE 'UTC', 'YYYY-MM')"
        seconds = _BUCKET_SECONDS[bucket]
        if self.dialect == "sqlite":
            return f"CAST({ts} / {seconds} AS INTEGER)"
        return f"CAST(floor({ts} / {seconds}) AS BIGINT)"

    @property
    def hour_sql(self) -> str:
        """The hour bucket of a raw row, as the writers file it (``rollup.hour_of``)."""
        return SQLITE_HOUR_SQL if self.dialect == "sqlite" else POSTGRES_HOUR_SQL

    def aggregates(self) -> str:
        """The raw rows' sums, in ``ROLLUP_MEASURES`` order."""
        cost, base = self.cost, self.baseline
        return (
            "COUNT(*), SUM(CASE WHEN status = 'ok' THEN 0 ELSE 1 END), "
            f"SUM(CASE WHEN {cost} IS NULL THEN 1 ELSE 0 END), "
            "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(cached_tokens), 0), "
            f"COALESCE(SUM(output_tokens), 0), SUM({cost}), SUM({base}), SUM({base} - {cost})"
        )

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

    def has_table(self, name: str) -> bool:
        if self.dialect == "postgres":
            found = self.rows("SELECT to_regclass(?)", (name,))
            return bool(found and found[0][0] is not None)
        return bool(self.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))

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


def _pg_probe(pg: Any) -> tuple[bool, bool, bool]:
    """(the ledger table exists, it has the rollups, the conversation spans are kept) on a
    PostgreSQL connection."""
    kept = False
    with pg.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (TABLE,))
        found = cur.fetchone()
        version = 0
        if found and found[0] is not None:
            cur.execute("SELECT MAX(version) FROM schema_migrations")
            got = cur.fetchone()
            version = int(got[0]) if got and got[0] is not None else 0
        if version >= SPANS_VERSION:
            cur.execute(f"SELECT spans FROM {ROLLUP_MARK}")
            got = cur.fetchone()
            kept = bool(got and got[0])
    ready = found is not None and found[0] is not None
    return ready, version >= ROLLUP_ROWS_VERSION, kept


@contextmanager
def _open_pg(url: str) -> Iterator[LedgerDb | None]:
    """A report connection from ``REPORT_CONNECTIONS``: an idle one that turns out dead (the
    server restarted, the backend was terminated) is replaced by a new one, once."""
    try:
        pg, reused = REPORT_CONNECTIONS.take(url)
        try:
            probed = _pg_probe(pg)
        except Exception:
            if not reused:
                pg.close()
                raise
            pg.close()
            pg = REPORT_CONNECTIONS.connect(url)
            probed = _pg_probe(pg)
    except LedgerUnavailable:
        raise
    except Exception as exc:  # psycopg.Error, or psycopg missing
        raise LedgerUnavailable(f"cannot connect to the PostgreSQL ledger: {exc}") from None
    try:
        ready, rollups, kept = probed
        yield LedgerDb("postgres", pg, rollups=rollups, spans=kept) if ready else None
    finally:
        REPORT_CONNECTIONS.give(url, pg)


@contextmanager
def open_db(url: str | Path) -> Iterator[LedgerDb | None]:
    """A ``LedgerDb`` for ``url`` (SQLite path/URL or postgresql://), or None when the ledger
    does not exist yet (a report never creates one). PostgreSQL connections are reused across
    reports (``pg.ReportConnections``)."""
    if is_postgres_url(url):
        with _open_pg(str(url).strip()) as db:
            yield db
        return
    path = ledger_path(url)
    if not path.is_file():
        yield None
        return
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not _sqlite_ready(conn):
            yield None
            return
        conn.execute("BEGIN")  # one snapshot (WAL) for the mark, the rollups and the raw rows
        (kept,) = conn.execute(f"SELECT spans FROM {ROLLUP_MARK}").fetchone()
        yield LedgerDb("sqlite", conn, rollups=True, rolled_through=mark(conn), spans=bool(kept))
    finally:
        conn.close()
