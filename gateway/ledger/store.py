"""The durable ledger store: SQLite (WAL) written by one background thread in batches.

The request path calls ``submit()`` (or ``write()``, fire and forget): a deque append and, at
most, an event set. A daemon writer thread drains the deque in transactions of up to
``batch_size`` rows (group commit). ``submit()`` returns an asyncio future that resolves once
the row is committed (True), or once its batch has failed for ``wait_timeout`` seconds (False;
the writer keeps retrying): the pipeline awaits it before the last byte of a response goes
out, so a client that saw a complete response has its row even if the process is SIGKILLed
right after. The writer resolves the futures of a batch with one ``call_soon_threadsafe`` per
event loop. Without waiting submitters it lingers up to ``flush_interval`` seconds to let a
batch fill; a submitted row is committed at once (rows arriving meanwhile form the next batch).
While the writer has nothing queued or in hand, ``submit()`` does not wake it: the rows that
one turn of the event loop submits are committed together at the end of that turn, on the
loop, on a connection that never waits for a lock (``in_place.InPlace``; anything in the way
hands them to the writer): the same durability without a loop -> thread -> loop round trip
per commit, and rows that finish together share a commit.
``flush()`` places a marker in the same FIFO queue and waits until the writer has committed
(and rolled up) everything in front of it. ``INSERT ... ON CONFLICT (request_id) DO NOTHING``
makes a replayed row harmless. Rows are committed alone; the writer adds them to the hourly and
daily rollups a little later in their own transaction (``rollup.roll``: every ``ROLL_ROWS``
rows, after ``ROLL_INTERVAL_S`` seconds, on ``flush()`` and at start-up for rows a crash left),
so a one-row commit a client waits for touches the ledger table only. Reports stay exact
meanwhile: they read the rows after the rollup mark raw (``query.grouped``).

WAL checkpoints run on a ``checkpoint.Checkpointer`` thread with its own connection, never
inside a commit a request waits for (SQLite's automatic checkpoint would: a 2-8 ms stall every
~1000 WAL pages). Several processes (gateway workers, the CLI) may open the same file: WAL journal,
``busy_timeout`` and a retry loop on "database is locked" keep them out of each other's way.
Money is stored as exact Decimal strings (TEXT), never floats.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections import deque
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.core.ledger_row import LedgerRow
from gateway.ledger import rollup
from gateway.ledger.checkpoint import Checkpointer, writer_settings
from gateway.ledger.in_place import InPlace, Waiter
from gateway.ledger.query import spent_since
from gateway.ledger.sqlite import (
    BUSY_TIMEOUT_MS,
    COLUMNS,
    SCHEMA_VERSION,
    START_PATIENCE_S,
    TABLE,
    connect,
    immediate,
    ledger_path,
    migrate,
    row_from_db,
    with_lock_retry,
)
from gateway.ledger.store_commit import BatchCommits

__all__ = [
    "BUSY_TIMEOUT_MS",
    "COLUMNS",
    "SCHEMA_VERSION",
    "TABLE",
    "SQLiteLedger",
    "ledger_path",
    "row_from_db",
]


log = logging.getLogger(__name__)
ROLL_ROWS = 512  # roll up once this many rows wait (a few ms of work in the writer thread)
ROLL_INTERVAL_S = 0.25  # ... or once rows have waited this long


class _Marker:
    """A flush marker travelling through the queue behind the rows it waits for."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class SQLiteLedger(BatchCommits):
    """Durable ledger with a batched background writer; see the module docstring."""

    _rollups = True  # keep the rollups (the PostgreSQL outbox keeps none: its rows move on)

    def __init__(
        self,
        path: Path,
        *,
        batch_size: int = 256,
        flush_interval: float = 0.05,
        max_pending: int = 1_000_000,
        wait_timeout: float = 5.0,
        background_checkpoints: bool = True,
        conversation_spans: bool = False,
        inline_commits: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if flush_interval < 0:
            raise ValueError("flush_interval must be >= 0")
        self.path = Path(path)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._max_pending = max_pending
        self._wait_timeout = wait_timeout
        self._queue: deque[LedgerRow | Waiter | _Marker] = deque()
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
        self._committed_hook: Any = None  # called (in the writer thread) after each commit
        self._checkpointer: Checkpointer | None = None  # WAL checkpoints off the commit path
        self._background_checkpoints = background_checkpoints  # False: SQLite's, inside commits
        self.conversation_spans = conversation_spans  # keep ``spans`` (schema v8) in the roll
        self._unrolled = 1 if self._rollups else 0  # rows committed, not yet rolled up (1: look at start)
        self._rolled_at = time.monotonic()
        self.roll_errors = 0
        self.phase = "not started"  # what ``start`` is doing (a slow start-up reports it)
        # commits on the loop; also this process's write lock (``lock``)
        self._in_place = InPlace(inline_commits, batch_size, self._to_writer, self._committed_on_loop)
        self._inline_counted = 0  # rows committed in place that the writer counted as unrolled
        self._asleep = False  # the writer waits without a timeout: an in-place commit wakes it

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Open the database (creating it and its parent directory), migrate the schema and
        start the writer thread. Raises if the database cannot be opened or migrated."""
        if self._thread is not None:
            return
        if self._closed:
            raise RuntimeError("this ledger was closed; create a new one")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.phase = "opening the database"
        conn = connect(self.path, check_same_thread=False)

        def waiting() -> None:
            self.phase = "waiting for another process's migration or back-fill (the database is locked)"

        try:
            self.phase = "migrating the schema"
            migrate(conn, patience_s=START_PATIENCE_S, waiting=waiting)  # another worker may be at it
            if self._background_checkpoints:
                writer_settings(conn)
            if self._rollups:  # ... or back-filling the spans
                self.phase = "rolling up and syncing the conversation spans"
                with_lock_retry(
                    lambda: rollup.sync_spans(conn, self.conversation_spans),
                    patience_s=START_PATIENCE_S,
                    waiting=waiting,
                )
        except BaseException:
            self.phase = "failed"
            conn.close()
            raise
        self.phase = "started"
        self._conn = conn
        self._in_place.open(self.path)
        if self._background_checkpoints:
            self._checkpointer = Checkpointer(self.path, lambda p: connect(p, check_same_thread=False))
            self._checkpointer.start()
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
        self._in_place.closed = True
        self._stopping = True
        self._wake.set()
        self._urgent.set()
        thread = self._thread
        if self._checkpointer is not None:
            self._checkpointer.stop(max(0.0, deadline - time.monotonic()))
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.error("ledger writer did not stop within %.1fs", timeout)
                return  # the thread closes the connection itself when it ends
        self._in_place.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- hot path --------------------------------------------------------------------------

    def write(self, row: LedgerRow) -> None:
        """Queue ``row`` for the writer. Never blocks on disk and never raises."""
        self._enqueue(row, row)

    def submit(self, row: LedgerRow) -> asyncio.Future[bool]:
        """Queue ``row`` and return a future (of the running loop) that resolves to True once
        the row is committed, or False when it cannot be (dropped, or its batch kept failing
        for ``wait_timeout`` s; the writer keeps retrying). Call it on the event loop.
        While the writer has nothing to do, the rows submitted in one turn of the loop are
        committed together on the loop at the end of that turn (``InPlace.end_of_turn``)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        if (
            self._in_place.enabled
            and not (self._closed or self._queue or self._inflight or self._failing)
            and self._in_place.take((row, fut), loop)
        ):
            return fut
        if not self._enqueue((row, fut), row):
            fut.set_result(False)
        return fut

    @property
    def inline_commits(self) -> int:
        """Rows committed on the loop (tests, benchmarks)."""
        return self._in_place.commits

    def _committed_on_loop(self) -> None:
        """After a commit on the loop (``in_place.InPlace.end_of_turn``)."""
        if self._asleep:  # the first on the loop since the writer went idle: it rolls them up
            self._asleep = False
            self._wake.set()
        if self._checkpointer is not None:
            self._checkpointer.committed()
        hook = self._committed_hook
        if hook is not None:
            hook()

    def _to_writer(self, waiter: Waiter) -> bool:
        return self._enqueue(waiter, waiter[0])

    def _enqueue(self, item: LedgerRow | Waiter, row: LedgerRow) -> bool:
        try:
            queue = self._queue
            if self._closed or len(queue) >= self._max_pending:
                self._dropped += 1
                if self._dropped & (self._dropped - 1) == 0:  # 1st, 2nd, 4th, 8th...: no log flood
                    why = "ledger closed" if self._closed else "queue full"
                    log.error("ledger rows dropped (%s): %d so far", why, self._dropped)
                return False
            queue.append(item)
            if not self._wake.is_set():
                self._wake.set()
            if (item is not row or len(queue) >= self._batch_size) and not self._urgent.is_set():
                self._urgent.set()  # a waiting client, or a full batch: do not linger
            return True
        except Exception:  # pragma: no cover - defensive: the request path must not fail
            log.exception("ledger write failed")
            return False

    # -- queries ---------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every row queued before this call is committed. False on timeout or
        when the writer is not running while rows are pending."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._stopping:
            return self.pending() == 0
        self._release([fut for _, fut in self._in_place.hand_over(timeout)], False)
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        self._urgent.set()
        return marker.done.wait(timeout)

    def pending(self) -> int:
        """Rows queued or in a transaction not yet committed (flush markers excluded)."""
        queued = sum(1 for item in tuple(self._queue) if not isinstance(item, _Marker))
        return queued + self._inflight + self._in_place.waiting()

    def outbox_rows(self) -> int:
        """Rows committed locally but not yet in the central store (0: this is the store)."""
        return 0

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        """USD spent per key/tenant/route name since ``since_ts``, over committed rows (for
        seeding budgets at start-up; blocking: call it off the event loop)."""
        return spent_since(self.path, scope, since_ts)

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
                woke = self._wake.wait(self._idle_wait())
                self._asleep = False
                inline = self.inline_commits - self._inline_counted
                if inline:  # rows committed in place since the last look: roll them too
                    self._inline_counted += inline
                    if self._rollups:
                        self._unrolled += inline
                if woke:
                    if not self._stopping and len(self._queue) < self._batch_size:
                        self._urgent.wait(self._flush_interval)  # linger: let a batch fill
                    # Clear before draining: a write() after this point sets _wake again.
                    self._wake.clear()
                    self._urgent.clear()
                    self._drain()
                if self._unrolled and (
                    self._unrolled >= ROLL_ROWS or time.monotonic() - self._rolled_at >= ROLL_INTERVAL_S
                ):
                    self._roll()
                if self._stopping and not self._queue:
                    self._roll()
                    return
        except BaseException:  # pragma: no cover - a bug; keep it visible via healthy()
            log.exception("ledger writer crashed")
            self._failing = True
        finally:
            if self._closed and self._conn is not None:
                self._conn.close()
                self._conn = None

    def _idle_wait(self) -> float | None:
        """How long the writer may wait for a write: until the next roll-up while rows are
        unrolled or in-place rows came since its last look, else until woken (an idle ledger
        costs no wake-ups; ``_committed_on_loop`` wakes it on the next rows committed there)."""
        if self._unrolled or self.inline_commits != self._inline_counted:
            return ROLL_INTERVAL_S
        self._asleep = True
        if self.inline_commits != self._inline_counted:  # one came meanwhile: do not sleep on it
            self._asleep = False
            return ROLL_INTERVAL_S
        return None

    def _roll(self) -> None:
        """Add every committed row after the rollup mark to the rollups (``rollup.roll``), in
        transactions of ``rollup.ROLL_LIMIT`` rows. A failure leaves the rows where they are
        (reports read them raw) and is retried at the next roll."""
        self._rolled_at = time.monotonic()
        conn = self._conn
        if not self._rollups or conn is None:
            self._unrolled = 0
            return
        try:
            while True:
                with self._in_place.lock, immediate(conn):
                    n = rollup.roll(conn, spans=self.conversation_spans)
                if n < rollup.ROLL_LIMIT:
                    break
            self._unrolled = 0
        except sqlite3.Error as exc:
            self.roll_errors += 1
            if self.roll_errors & (self.roll_errors - 1) == 0:  # 1st, 2nd, 4th...: no log flood
                log.error("ledger rollup failed (rows stay exact in reports; retrying): %s", exc)

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch: list[LedgerRow] = []
            waiters: list[asyncio.Future[bool]] = []
            markers: list[_Marker] = []
            while queue and len(batch) < self._batch_size:
                item = queue.popleft()
                if isinstance(item, LedgerRow):
                    batch.append(item)
                elif isinstance(item, tuple):
                    batch.append(item[0])
                    waiters.append(item[1])
                else:
                    markers.append(item)
                    break  # commit what is in front of it, then release the waiter
            self._inflight = len(batch)
            committed = True
            if batch:
                committed = self._commit(batch, waiters)
            self._inflight = 0
            if waiters:
                self._release(waiters, committed)
            if markers:
                self._roll()
            for marker in markers:
                marker.done.set()
            hook = self._committed_hook
            if batch:
                if self._checkpointer is not None:
                    self._checkpointer.committed()
                if hook is not None:
                    hook()
