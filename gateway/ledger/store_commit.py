"""The SQLite ledger writer's commits (``store.SQLiteLedger`` inherits them): one batch in one
transaction, retried while the failure is transient (locked, disk full, I/O error) and split
row by row when the database rejects a row outright; the waiting submitters released on their
event loops, one thread-safe call per loop, with the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.in_place import InPlace
from gateway.ledger.sqlite import INSERT_SQL, immediate, is_locked_error, row_params

log = logging.getLogger("gateway.ledger.store")


def _resolve(futures: list[asyncio.Future[bool]], committed: bool) -> None:
    """On the event loop: resolve the futures of one batch (skipping cancelled ones)."""
    for fut in futures:
        if not fut.done():
            fut.set_result(committed)


class BatchCommits:
    """The writer thread's commits; the state is the ledger's (see ``store.SQLiteLedger``)."""

    _rollups: bool
    _conn: sqlite3.Connection | None
    _in_place: InPlace
    _unrolled: int
    _failing: bool
    _stopping: bool
    _dropped: int
    _wait_timeout: float
    last_error: str | None

    @staticmethod
    def _release(waiters: list[asyncio.Future[bool]], committed: bool) -> None:
        """Resolve ``waiters`` on their loops: one thread-safe call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[bool]]] = {}
        for fut in waiters:
            by_loop.setdefault(fut.get_loop(), []).append(fut)
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve, futures, committed)

    def _commit(self, batch: list[LedgerRow], waiters: list[asyncio.Future[bool]] | None = None) -> bool:
        """Commit ``batch``, retrying transient failures until it lands or we are closing
        and out of patience. Rows the database rejects outright are logged and skipped.
        ``waiters`` are released (False) once the batch has failed for ``wait_timeout`` s, so
        a broken disk delays responses by that much at most. True when the batch landed."""
        delay = 0.05
        started = time.monotonic()
        while True:
            try:
                self._insert(batch)
                self._failing = False
                self.last_error = None
                return True
            except sqlite3.OperationalError as exc:  # locked, disk full, I/O error: retry
                self._note_failure(exc)
                if self._stopping and not is_locked_error(exc) and delay > 2.0:
                    log.error("ledger: giving up on %d rows while closing", len(batch))
                    self._dropped += len(batch)
                    return False
            except (sqlite3.Error, ValueError, TypeError, OverflowError) as exc:
                self._note_failure(exc)
                self._insert_one_by_one(batch)
                self._failing = False  # a rejected row is the row's fault, not the database's
                return True
            if waiters and time.monotonic() - started >= self._wait_timeout:
                self._release(waiters, False)
                waiters = None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _insert(self, batch: list[LedgerRow]) -> None:
        conn = self._conn
        if conn is None:
            raise sqlite3.OperationalError("ledger connection is closed")
        params = [row_params(r) for r in batch]
        with self._in_place.lock, immediate(conn):  # never meets an in-place commit: no busy sleep
            conn.executemany(INSERT_SQL, params)
        if self._rollups:
            self._unrolled += len(params)

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
