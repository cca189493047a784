"""The durable ledger store: SQLite (WAL) written by one background thread in batches.

The request path only calls ``write()``: a deque append and, at most, an event set. A daemon
writer thread drains the deque in transactions of up to ``batch_size`` rows, lingering up to
``flush_interval`` seconds to let a batch fill. ``flush()`` places a marker in the same FIFO
queue and waits until the writer has committed everything in front of it.

Several processes (gateway workers, the CLI) may open the same file: WAL journal,
``busy_timeout`` and a retry loop on "database is locked" keep them out of each other's way.
Money is stored as exact Decimal strings (TEXT), never floats.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path

from gateway.ledger.row import LedgerRow
from gateway.ledger.sqlite import (
    BUSY_TIMEOUT_MS,
    COLUMNS,
    INSERT_SQL,
    SCHEMA_VERSION,
    TABLE,
    connect,
    is_locked_error,
    ledger_path,
    migrate,
    row_from_db,
    row_params,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "COLUMNS",
    "SCHEMA_VERSION",
    "TABLE",
    "SQLiteLedger",
    "ledger_path",
    "open_ledger",
    "row_from_db",
]

log = logging.getLogger(__name__)


class _Marker:
    """A flush marker travelling through the queue behind the rows it waits for."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class SQLiteLedger:
    """Durable ledger with a batched background writer; see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        max_pending: int = 1_000_000,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval < 0:
            raise ValueError("flush_interval must be >= 0")
        self.path = Path(path)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._max_pending = max_pending
        self._queue: deque[LedgerRow | _Marker] = deque()
        self._wake = threading.Event()  # something is queued
        self._urgent = threading.Event()  # stop lingering: batch full, flush or close
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._inflight = 0
        self._dropped = 0
        self._failing = False
        self.last_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Open the database (creating it and its parent directory), migrate the schema and
        start the writer thread. Raises if the database cannot be opened or migrated."""
        if self._thread is not None:
            return
        if self._closed:
            raise RuntimeError("this ledger was closed; create a new one")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect(self.path, check_same_thread=False)
        try:
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Commit everything written so far, then stop the writer and close the database."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        if self._thread is not None and not self.flush(timeout):
            log.error("ledger close: %d rows still pending after %.1fs", self.pending(), timeout)
        self._closed = True
        self._stopping = True
        self._wake.set()
        self._urgent.set()
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.error("ledger writer did not stop within %.1fs", timeout)
                return  # the thread closes the connection itself when it ends
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- hot path --------------------------------------------------------------------------

    def write(self, row: LedgerRow) -> None:
        """Queue ``row`` for the writer. Never blocks on disk and never raises."""
        try:
            queue = self._queue
            if self._closed or len(queue) >= self._max_pending:
                self._dropped += 1
                if self._dropped & (self._dropped - 1) == 0:  # 1st, 2nd, 4th, 8th...: no log flood
                    why = "ledger closed" if self._closed else "queue full"
                    log.error("ledger rows dropped (%s): %d so far", why, self._dropped)
                return
            queue.append(row)
            if not self._wake.is_set():
                self._wake.set()
            if len(queue) >= self._batch_size and not self._urgent.is_set():
                self._urgent.set()
        except Exception:  # pragma: no cover - defensive: the request path must not fail
            log.exception("ledger write failed")

    # -- queries ---------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every row queued before this call is committed. False on timeout or
        when the writer is not running while rows are pending."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._stopping:
            return self.pending() == 0
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        self._urgent.set()
        return marker.done.wait(timeout)

    def pending(self) -> int:
        """Rows queued or in a transaction not yet committed (flush markers excluded)."""
        queued = sum(1 for item in tuple(self._queue) if not isinstance(item, _Marker))
        return queued + self._inflight

    def dropped(self) -> int:
        """Rows refused by ``write()`` (after close, or with ``max_pending`` rows queued)."""
        return self._dropped

    def healthy(self) -> bool:
        """The writer thread is alive and its last commit (or the schema set-up) succeeded.
        Writability is learnt from real commits: an idle ledger reports its last outcome."""
        thread = self._thread
        return (
            thread is not None
            and thread.is_alive()
            and not self._stopping
            and not self._failing
            and self._conn is not None
        )

    # -- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait()
                if not self._stopping and len(self._queue) < self._batch_size:
                    self._urgent.wait(self._flush_interval)  # linger: let a batch fill
                # Clear before draining: a write() after this point sets _wake again.
                self._wake.clear()
                self._urgent.clear()
                self._drain()
                if self._stopping and not self._queue:
                    return
        except BaseException:  # pragma: no cover - a bug; keep it visible via healthy()
            log.exception("ledger writer crashed")
            self._failing = True
        finally:
            if self._closed and self._conn is not None:
                self._conn.close()
                self._conn = None

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch: list[LedgerRow] = []
            markers: list[_Marker] = []
            while queue and len(batch) < self._batch_size:
                item = queue.popleft()
                if isinstance(item, _Marker):
                    markers.append(item)
                    break  # commit what is in front of it, then release the waiter
                batch.append(item)
            self._inflight = len(batch)
            if batch:
                self._commit(batch)
            self._inflight = 0
            for marker in markers:
                marker.done.set()

    def _commit(self, batch: list[LedgerRow]) -> None:
        """Commit ``batch``, retrying transient failures until it lands or we are closing
        and out of patience. Rows the database rejects outright are logged and skipped."""
        delay = 0.05
        while True:
            try:
                self._insert(batch)
                self._failing = False
                self.last_error = None
                return
            except sqlite3.OperationalError as exc:  # locked, disk full, I/O error: retry
                self._note_failure(exc)
                if self._stopping and not is_locked_error(exc) and delay > 2.0:
                    log.error("ledger: giving up on %d rows while closing", len(batch))
                    self._dropped += len(batch)
                    return
            except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
                self._note_failure(exc)
                self._insert_one_by_one(batch)
                self._failing = False  # a rejected row is the row's fault, not the database's
                return
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _insert(self, batch: list[LedgerRow]) -> None:
        conn = self._conn
        if conn is None:
            raise sqlite3.OperationalError("ledger connection is closed")
        params = [row_params(r) for r in batch]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(INSERT_SQL, params)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _insert_one_by_one(self, batch: list[LedgerRow]) -> None:
        for row in batch:
            try:
                self._insert([row])
            except sqlite3.OperationalError:
                self._commit([row])  # transient again: retry this one row
            except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
                self._dropped += 1
                log.error("ledger row %s rejected: %s", row.request_id, exc)

    def _note_failure(self, exc: BaseException) -> None:
        if not self._failing:
            log.error("ledger write failed: %s", exc)
        self._failing = True
        self.last_error = str(exc)


def open_ledger(
    url: str,
    *,
    batch_size: int = 256,
    flush_interval: float = 0.05,
    max_pending: int = 1_000_000,
) -> SQLiteLedger:
    """A (not yet started) ledger for ``url``: ``sqlite:///<path>`` or a plain path.
    ``postgresql://`` raises ValueError (the PostgreSQL ledger is not implemented yet)."""
    return SQLiteLedger(
        ledger_path(url), batch_size=batch_size, flush_interval=flush_interval, max_pending=max_pending
    )
