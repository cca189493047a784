"""One PostgreSQL connection held by one lock, for a store whose calls run off the event loop
in threads: opened at first use, closed and reopened after a failure (a restarted database
or a dropped connection costs the one call that saw it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from gateway.ledger.pg import pg_connect

_T = TypeVar("_T")


class PgConn:
    placeholder = "%s"

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._conn: Any = None

    def transaction(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(cursor, *args)`` in one transaction."""
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = pg_connect(self.url)
                self._conn.autocommit = True
            try:
                with self._conn.transaction(), self._conn.cursor() as cur:
                    return fn(cur, *args)
            except Exception:
                self._conn.close()
                self._conn = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
