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
from pathlib import Path
from typing import Final

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.sqlite import INSERT_SQL, connect, immediate, row_params

GAP_S: Final = 0.002  # seconds between rows, this one and on average, for a row to go in place
GAP_AVG_WEIGHT: Final = 0.125  # the moving average of the gaps: ~the last 8


class InPlace:
    """The connection, lock and rate estimate of in-place commits; ``enabled=False``: never
    (the lock still serialises the writer's transactions, uncontended)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()
        self.commits = 0  # rows committed in place; written by the submitting thread only
        self._conn: sqlite3.Connection | None = None
        self._last = 0.0
        self._gap_avg = 1.0  # a start is quiet

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

    def quiet(self, now: float) -> bool:
        """Note a submit at ``now`` (monotonic s); True when its row may go in place (a lull in
        a busy stream is not quiet: its rows go on sharing the writer's commits)."""
        gap = min(now - self._last, 1.0)
        self._last = now
        self._gap_avg += (gap - self._gap_avg) * GAP_AVG_WEIGHT
        return self._conn is not None and gap >= GAP_S and self._gap_avg >= GAP_S

    def commit(self, row: LedgerRow) -> bool:
        """Commit ``row`` now: True when it landed, False at once on anything in the way (the
        lock held, busy, an error: the caller hands the row to the writer)."""
        conn = self._conn
        if conn is None or not self.lock.acquire(blocking=False):
            return False
        try:
            with immediate(conn):
                conn.execute(INSERT_SQL, row_params(row))
            self.commits += 1
            return True
        except (sqlite3.Error, ValueError, TypeError, OverflowError):
            return False
        finally:
            self.lock.release()
