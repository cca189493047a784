"""The PostgreSQL connection for the ledger's writer and its reports.

psycopg is imported lazily (``pip install 'switchyard[postgres]'``), so a SQLite-only
installation never needs it.

``ReportConnections`` keeps a few idle report connections per process, so a long-lived
process (the gateway's admin API, the dashboard) does not pay a new connection (a backend
fork and its start-up, 5-20 ms) per report. A connection is lent to one caller at a time
(reports run in threads, ``asyncio.to_thread``: concurrent reports get one each), runs each
report as one read-only REPEATABLE READ transaction (one snapshot), is rolled back when it
comes back, and dropped when it broke; a process forked from its owner never reuses the
owner's connections.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import psycopg

IDLE_MAX: Final = 4  # idle report connections kept per process, all URLs together


def pg_connect(url: str, timeout: float = 5.0) -> psycopg.Connection[Any]:
    """A psycopg connection (imported lazily: ``pip install 'switchyard[postgres]'``)."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError("the PostgreSQL ledger needs psycopg: pip install 'switchyard[postgres]'") from exc
    return psycopg.connect(url, connect_timeout=max(1, int(timeout)), application_name="switchyard")


class ReportConnections:
    """Idle report connections, most recently returned last; at most ``idle_max`` kept."""

    def __init__(self, idle_max: int = IDLE_MAX) -> None:
        self.idle_max = idle_max
        self._lock = threading.Lock()
        self._idle: deque[tuple[str, psycopg.Connection[Any]]] = deque()
        self._pid = os.getpid()
        self.connects = 0  # connections opened (tests and the benchmark read it)

    def take(self, url: str) -> tuple[psycopg.Connection[Any], bool]:
        """An idle connection to ``url`` (and True) or a new one (and False)."""
        with self._lock:
            if self._pid != os.getpid():  # forked: the sockets belong to the parent
                self._idle.clear()
                self._pid = os.getpid()
            for i in range(len(self._idle) - 1, -1, -1):
                if self._idle[i][0] == url:
                    conn = self._idle[i][1]
                    del self._idle[i]
                    return conn, True
        return self.connect(url), False

    def connect(self, url: str) -> psycopg.Connection[Any]:
        """A new report connection: read-only, each report one REPEATABLE READ transaction (one
        snapshot for all its statements, as a SQLite report), ended when it comes back."""
        conn = pg_connect(url)  # first: it says which extra to install when psycopg is missing
        import psycopg

        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with self._lock:
            self.connects += 1
        return conn

    def give(self, url: str, conn: psycopg.Connection[Any]) -> None:
        """Return ``conn`` after a report: rolled back and kept, or closed if it broke."""
        try:
            if not conn.closed and not conn.broken:
                conn.rollback()
        except Exception:  # a connection that cannot roll back is dropped below
            pass
        if conn.closed or conn.broken:
            conn.close()
            return
        evicted = None
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append((url, conn))
                if len(self._idle) > self.idle_max:
                    evicted = self._idle.popleft()[1]
            else:
                evicted = conn
        if evicted is not None:
            evicted.close()

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for _, conn in idle:
            conn.close()


REPORT_CONNECTIONS: Final = ReportConnections()
atexit.register(REPORT_CONNECTIONS.close_all)
