"""WAL checkpoints off the commit path, for the SQLite ledger writer.

SQLite's automatic checkpoint runs inside the commit that pushes the WAL past 1000 pages: with
a durable ledger that commit is a request waiting for its row, so every few hundred requests
one of them waited the 2-8 ms of copying the WAL back into the database (at 300 req/s: commit
p99 3.8-8 ms, a stall every ~0.28 s; `python -m load_tests.ledger_commit_latency`).

Here the writer's connection keeps only a far-away safety net (``SAFETY_NET_PAGES``) and a
``Checkpointer`` thread, on its own connection, runs ``PRAGMA wal_checkpoint(PASSIVE)`` soon
after commits: a passive checkpoint never takes the write lock, so commits go on meanwhile, and
sqlite3 releases the GIL while it copies. It repeats a pass until the WAL is wholly copied (each
repeat only copies what was committed during the previous pass), which lets the writer's next
transaction start the WAL over from its beginning, so the file stays small;
``journal_size_limit`` gives back the space a burst took.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

SAFETY_NET_PAGES: Final = 16_384  # 64 MB of 4 KB pages: only if the checkpointer falls behind
JOURNAL_SIZE_LIMIT: Final = 32 * 1024 * 1024  # bytes the WAL file keeps once it starts over
_PASSES: Final = 8  # catch-up passes per round (each copies what the previous pass missed)
RESTART_WAIT_MS: Final = 10  # how long a RESTART may wait for a reader (then: next round)
RESTART_FRAMES: Final = 4096  # 16 MB of WAL not started over: one short RESTART checkpoint


def writer_settings(conn: sqlite3.Connection) -> None:
    """Settings of the writer's own connection: checkpoints are the ``Checkpointer``'s job."""
    conn.execute(f"PRAGMA wal_autocheckpoint = {SAFETY_NET_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")


class Checkpointer:
    """A daemon thread checkpointing ``path``'s WAL ``interval`` s after commits (see module)."""

    def __init__(
        self, path: Path, connect: Callable[[Path], sqlite3.Connection], interval: float = 0.1
    ) -> None:
        self._path = path
        self._connect = connect
        self._interval = interval
        self._dirty = False  # set by the writer after a commit: a plain store, no wake-up
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # checkpoint rounds run (tests)
        self.caught_up = 0  # rounds that copied the whole WAL
        self.restarts = 0  # RESTART checkpoints run
        self.errors = 0  # rounds that failed (busy, I/O)

    def committed(self) -> None:
        """Called by the writer thread after each commit."""
        self._dirty = True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ledger-checkpoint", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop.wait(self._interval):
                if not self._dirty:
                    continue
                self._dirty = False
                try:
                    if conn is None:
                        conn = self._connect(self._path)
                        # a RESTART holds new writers back while it waits: never for long
                        conn.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")
                    self.checkpoint(conn)
                except sqlite3.Error as exc:  # busy, I/O: the next round tries again
                    self.errors += 1
                    if self.errors & (self.errors - 1) == 0:  # 1st, 2nd, 4th...: no log flood
                        log.warning("ledger checkpoint failed (%d so far): %s", self.errors, exc)
        finally:
            if conn is not None:
                conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> bool:
        """One round of passive passes until the whole WAL is copied; True when it was. The
        WAL starts over only when a write begins with nothing left to copy, which a commit
        landing between the last pass and the next write prevents; under steady load that
        race is lost often, so past ``RESTART_FRAMES`` one RESTART checkpoint (it holds
        writers back while it copies the few frames the passes left) starts it over."""
        self.rounds += 1
        done = False
        frames = 0
        for _ in range(_PASSES):
            # fetchall: a pragma statement left un-stepped would hold a read snapshot and keep
            # the WAL from ever starting over
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()[0]
            if busy or frames < 0:
                break
            if copied >= frames:
                done = True
                break
        if frames >= RESTART_FRAMES:
            conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            self.restarts += 1
        if done:
            self.caught_up += 1
        return done
