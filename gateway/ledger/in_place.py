"""Commits on the event loop for the SQLite ledger while its writer thread is idle.

Handing a row to the writer thread costs a loop -> writer -> loop round trip (~100 us of CPU
and as much latency per commit on a 2-core VM) on top of the commit, and rows handed over one
by one (an open-loop stream, a row every 0.3-3 ms) each pay it and a commit of their own.
``InPlace`` commits the rows one turn of the loop submitted (``SQLiteLedger._commit_on_loop``)
in one transaction on the loop's thread. Its connection never waits for a lock
(``busy_timeout = 0``: a held lock, a roll, a RESTART checkpoint or another process's
transaction hands the rows to the writer, which waits and retries) and never checkpoints
(``wal_autocheckpoint = 0``: the checkpointer's job). ``lock`` is this process's write lock:
the writer holds it around its own transactions, so it never meets a commit on the loop in
SQLite's busy handler (which sleeps 1 ms and more); a commit on the loop only ever tries it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.sqlite import INSERT_SQL, connect, immediate, row_params


class InPlace:
    """The connection and lock of commits on the loop; ``enabled=False``: never (the lock
    still serialises the writer's transactions, uncontended)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()
        self.commits = 0  # rows committed in place; written by the submitting thread only
        self._conn: sqlite3.Connection | None = None

    def open(self, path: Path) -> None:
        if self.enabled and self._conn is None:
            conn = connect(path, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def commit(self, rows: Sequence[LedgerRow]) -> bool:
        """Commit ``rows`` now, in one transaction: True when they landed, False at once on
        anything in the way (the lock held, busy, an error: the caller hands them to the
        writer)."""
        conn = self._conn
        if conn is None or not self.lock.acquire(blocking=False):
            return False
        try:
            with immediate(conn):
                conn.executemany(INSERT_SQL, [row_params(row) for row in rows])
            self.commits += len(rows)
            return True
        except (sqlite3.Error, ValueError, TypeError, OverflowError):
            return False
        finally:
            self.lock.release()
