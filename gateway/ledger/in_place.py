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

import asyncio
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.sqlite import INSERT_SQL, connect, immediate, row_params

Waiter = tuple[LedgerRow, "asyncio.Future[bool]"]


class InPlace:
    """The rows waiting for their loop turn's end, the connection and the lock of commits on
    the loop; ``enabled=False``: never (the lock still serialises the writer's transactions,
    uncontended). ``to_writer(waiter)`` hands a row over (False: refused, closed);
    ``committed()`` runs after each commit on the loop."""

    def __init__(
        self,
        enabled: bool,
        batch_size: int,
        to_writer: Callable[[Waiter], bool],
        committed: Callable[[], None],
    ) -> None:
        self.enabled = enabled
        self.lock = threading.Lock()
        self.commits = 0  # rows committed on the loop; written by the loop's thread only
        self.closed = False
        self._conn: sqlite3.Connection | None = None
        self._batch_size = batch_size
        self._to_writer = to_writer
        self._committed = committed
        self._rows: deque[Waiter] = deque()  # submitted this turn of the loop, to commit at its end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False  # a commit on the loop is in progress

    def waiting(self) -> int:
        """Rows submitted and not committed here yet (a commit in progress counts one)."""
        return len(self._rows) + self._busy

    def take(self, waiter: Waiter, loop: asyncio.AbstractEventLoop) -> bool:
        """Keep ``waiter`` for the end of this turn of ``loop`` (the first of a turn schedules
        the commit); False: not here (another loop's turn is pending, or a batch is full)."""
        rows = self._rows
        if not rows:
            self._loop = loop
            loop.call_soon(self.end_of_turn)
        if self._loop is not loop or len(rows) >= self._batch_size:
            return False
        rows.append(waiter)
        return True

    def end_of_turn(self) -> None:
        """Commit the rows this turn of the loop submitted, in one transaction on the loop's
        thread; anything in the way (the lock held, busy, an error) hands them to the writer."""
        items: list[Waiter] = []
        rows = self._rows
        self._busy = True
        try:
            while rows:  # popleft: a flush() in another thread may take them too
                items.append(rows.popleft())
            if not items:
                return
            if self.closed or not self.commit([row for row, _ in items]):
                for item in items:
                    if not self._to_writer(item):
                        item[1].set_result(False)
                return
        finally:
            self._busy = False
        for _, fut in items:
            if not fut.done():  # cancelled: its request is gone; the row is committed anyway
                fut.set_result(True)
        self._committed()

    def hand_over(self, timeout: float) -> list[Waiter]:
        """Hand the rows waiting for their turn's end to the writer and wait out a commit on
        the loop in progress (``flush`` and ``close``: nothing submitted is missed); returns
        those the writer refused (to be released False)."""
        refused: list[Waiter] = []
        rows = self._rows
        while rows:
            try:
                item = rows.popleft()
            except IndexError:
                break
            if not self._to_writer(item):
                refused.append(item)
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.001)
        return refused

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
