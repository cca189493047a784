"""In-place commits for the SQLite ledger's quiet moments.

At low rates nearly every ledger row is a commit of its own, and handing it to the writer
thread costs a loop -> writer -> loop round trip (~100 us of CPU and as much latency per
request on a 2-core VM) on top of the commit. ``InPlace`` lets ``SQLiteLedger.submit`` commit
such a row itself: when it and the recent rows (a moving average of the gaps) came at least
``GAP_S`` apart. Its connection never waits for a lock (``busy_timeout = 0``: a held lock, a
roll, a RESTART checkpoint or another process's transaction sends the row to the writer, which
waits and retries) and never checkpoints (``wal_autocheckpoint = 0``: the checkpointer's job).
``lock`` is this process's write lock: the writer holds it around its own transactions, so it
never meets an in-place commit in SQLite's busy handler (which sleeps 1 ms and more); an
in-place commit only ever tries it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.sqlite import INSERT_SQL, connect, immediate, row_params


class InPlace:
    """The connection, lock and rate estimate of in-place commits; ``enabled=False``: never
    (the lock still serialises the writer's transactions, uncontended)."""

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
