"""The PostgreSQL ledger: a local durable outbox (SQLite, WAL) shipped to PostgreSQL.

The request path never waits on PostgreSQL. Rows are group-committed to the outbox file under
``SWITCHYARD_HOME`` exactly as the SQLite ledger commits them (``SQLiteLedger`` is the outbox
writer), so a row a client saw completed survives SIGKILL and PostgreSQL outages alike. A
shipper thread moves them in batches: read the oldest rows, ``INSERT ... ON CONFLICT
(request_id) DO NOTHING`` them in one PostgreSQL transaction, then delete them from the outbox
by request id. A crash between the two commits ships the batch again, which the unique
request id turns into a no-op: every row arrives, none twice. While PostgreSQL is down the
shipper backs off (0.2 s doubling to 5 s) and the rows wait (``outbox_rows()``, exported as
``switchyard_ledger_outbox_rows``). Several workers may share one outbox file.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gateway.ledger import rollup, spans
from gateway.ledger.pg import pg_connect
from gateway.ledger.query import spent_since
from gateway.ledger.schema import (
    COLUMNS,
    POSTGRES_INSERT_SQL,
    POSTGRES_MIGRATIONS,
    ROLLUP_MARK,
    SPAN_TABLE,
    SQLITE_COLUMNS,
    TABLE,
    apply_migrations,
)
from gateway.ledger.sqlite import connect, immediate
from gateway.ledger.store import SQLiteLedger

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

_SELECT_OUTBOX: Final = f"SELECT {', '.join(SQLITE_COLUMNS)} FROM {TABLE} ORDER BY id LIMIT ?"
_INSERT_RETURNING: Final = POSTGRES_INSERT_SQL + " RETURNING request_id"
_DELETE_OUTBOX: Final = f"DELETE FROM {TABLE} WHERE request_id = ?"
_MONEY: Final = (COLUMNS.index("cost_usd"), COLUMNS.index("baseline_cost_usd"))
_MIGRATION_LOCK: Final = 0x5357_4C44  # pg_advisory_xact_lock key: one migrator at a time
_SPAN_FIELDS: Final = tuple(SQLITE_COLUMNS.index(c) for c in ("ts", "conversation", "cost_e10"))


def pg_migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the PostgreSQL schema up to date (serialised by an advisory lock)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        return apply_migrations(cur.execute, POSTGRES_MIGRATIONS, "%s")


def _pg_params(values: tuple[Any, ...]) -> tuple[Any, ...]:
    out = list(values[: len(COLUMNS)])
    for i in _MONEY:
        if out[i] is not None:
            out[i] = Decimal(out[i])
    return tuple(out)


def pg_spans_state(conn: psycopg.Connection[Any], keep: bool) -> None:
    """The conversation spans in line with ``keep`` (see ``spans``): turned on, back-filled
    once with inserts held off (``LOCK``), so no shipped row is missed or counted twice;
    turned off, emptied and marked stale."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SELECT spans FROM {ROLLUP_MARK}")
        got = cur.fetchone()
        if got is not None and bool(got[0]) == keep:
            return
        cur.execute(f"LOCK TABLE {TABLE} IN SHARE ROW EXCLUSIVE MODE")
        cur.execute(f"SELECT spans FROM {ROLLUP_MARK}")
        got = cur.fetchone()
        if got is not None and bool(got[0]) == keep:
            return  # another shipper did it meanwhile
        cur.execute(f"TRUNCATE {SPAN_TABLE}")  # a fresh file: no dead rows left for the scans
        if keep:
            log.info("ledger: building the conversation spans in PostgreSQL from the rows (once)")
            for stmt in spans.backfill_sql("postgres", through=False):
                cur.execute(stmt)
            cur.execute(f"ANALYZE {SPAN_TABLE}")  # the planner's row counts for the bound queries
        cur.execute(spans.kept_sql(keep))


def ship_rows(cur: psycopg.Cursor[Any], rows: list[tuple[Any, ...]], *, keep_spans: bool = False) -> int:
    """Insert outbox ``rows`` (``SQLITE_COLUMNS`` order) into PostgreSQL and add the ones
    really inserted (not already there) to the rollups (``keep_spans``: and to the
    conversation spans; else they are marked stale), in the cursor's transaction. Returns
    how many were inserted."""
    cur.executemany(_INSERT_RETURNING, [_pg_params(r) for r in rows], returning=True)
    inserted: set[str] = set()
    for _ in cur.results():
        inserted.update(str(found[0]) for found in cur.fetchall())
    fresh = [r for r in rows if r[0] in inserted]
    for table, table_cells in rollup.cells(rollup.facts(fresh)).items():
        cur.executemany(rollup.POSTGRES_UPSERT[table], rollup.params(table_cells, Decimal))
    if keep_spans:
        ts, conversation, cost = _SPAN_FIELDS
        found = spans.cells((r[ts], r[conversation], r[cost]) for r in fresh)
        if found:
            cur.executemany(spans.UPSERT["postgres"], spans.params(found))
    else:
        cur.execute(spans.STALE_SQL)
    return len(fresh)


def outbox_path_for(home: Path) -> Path:
    return home / "ledger-outbox.db"


class PostgresLedger(SQLiteLedger):
    """``SQLiteLedger`` on the outbox file plus a shipper thread to PostgreSQL."""

    def __init__(
        self,
        url: str,
        outbox: Path,
        *,
        ship_batch: int = 1000,
        idle_interval: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(outbox, **kwargs)
        self.url = url
        self._ship_batch = ship_batch
        self._idle_interval = idle_interval
        self._ship_wake = threading.Event()
        self._ship_stop = threading.Event()
        self._shipper: threading.Thread | None = None
        self._pg: psycopg.Connection[Any] | None = None
        self._outbox_count = 0
        self.shipped = 0  # rows this process moved to PostgreSQL
        self.ship_error: str | None = None  # the last PostgreSQL failure, None once it works
        self._committed_hook = self._ship_wake.set
        self._rollups = False  # the outbox: rows move on to PostgreSQL, which keeps the rollups

    def start(self) -> None:
        """Open the outbox (raises if it cannot be); PostgreSQL may be down: rows wait."""
        super().start()
        if self._shipper is None:
            self._shipper = threading.Thread(target=self._ship_loop, name="ledger-shipper", daemon=True)
            self._shipper.start()

    def close(self, timeout: float = 10.0) -> None:
        """Commit pending rows to the outbox, then ship what PostgreSQL takes within
        ``timeout``; whatever is left stays in the outbox for the next start."""
        deadline = time.monotonic() + timeout
        super().close(timeout)
        shipper = self._shipper
        if shipper is not None:
            self._ship_stop.set()
            self._ship_wake.set()
            shipper.join(max(0.0, deadline - time.monotonic()))
            if shipper.is_alive():
                log.warning("ledger: %d rows left in the outbox at shutdown", self._outbox_count)

    def outbox_rows(self) -> int:
        return self._outbox_count

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        """PostgreSQL (its rollups and edge rows) plus the rows still waiting in the outbox,
        read raw (the outbox keeps no rollups; a row being shipped at this very moment may
        count twice: budgets err on the safe side)."""
        total = spent_since(self.url, scope, since_ts)
        for name, usd in spent_since(self.path, scope, since_ts, rollups=False).items():
            total[name] = total.get(name, Decimal(0)) + usd
        return total

    def ship_now(self, timeout: float = 10.0) -> bool:
        """Flush to the outbox and wait until the outbox is empty (True) or ``timeout``."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        probe = connect(self.path)
        try:
            while True:
                self._ship_wake.set()
                left = probe.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()
                if left is not None and int(left[0]) == 0:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
        finally:
            probe.close()

    # -- shipper thread -------------------------------------------------------------------

    def _ship_loop(self) -> None:
        outbox = connect(self.path, check_same_thread=False)
        delay = 0.2
        try:
            while True:
                stopping = self._ship_stop.is_set()
                try:
                    self._ship_all(outbox)
                    delay = 0.2
                except Exception as exc:
                    self._pg_failed(exc)
                    if stopping:
                        return
                    self._ship_stop.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if stopping:
                    return
                self._ship_wake.wait(self._idle_interval)
                self._ship_wake.clear()
        finally:
            outbox.close()
            self._close_pg()

    def _ship_all(self, outbox: sqlite3.Connection) -> None:
        while True:
            rows = outbox.execute(_SELECT_OUTBOX, (self._ship_batch,)).fetchall()
            if not rows:
                self._outbox_count = 0
                return
            pg = self._pg_conn()
            try:
                with pg.cursor() as cur:
                    ship_rows(cur, rows, keep_spans=self.conversation_spans)
                pg.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    pg.rollback()
                raise
            ids = [(r[0],) for r in rows]
            with immediate(outbox):
                outbox.executemany(_DELETE_OUTBOX, ids)
            self.shipped += len(rows)
            if self.ship_error is not None:
                log.info("ledger: PostgreSQL is back; shipping the outbox")
                self.ship_error = None
            left = outbox.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()
            self._outbox_count = int(left[0]) if left else 0

    def _pg_conn(self) -> psycopg.Connection[Any]:
        if self._pg is None or self._pg.closed:
            conn = pg_connect(self.url)
            try:
                pg_migrate(conn)
                pg_spans_state(conn, self.conversation_spans)
            except BaseException:
                conn.close()
                raise
            self._pg = conn
        return self._pg

    def _pg_failed(self, exc: BaseException) -> None:
        if self.ship_error is None:
            log.error("ledger: cannot ship to PostgreSQL (rows wait in the outbox): %s", exc)
        self.ship_error = str(exc) or type(exc).__name__
        self._close_pg()
        try:
            probe = connect(self.path)
            try:
                left = probe.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()
                self._outbox_count = int(left[0]) if left else 0
            finally:
                probe.close()
        except sqlite3.Error:
            pass

    def _close_pg(self) -> None:
        conn, self._pg = self._pg, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
