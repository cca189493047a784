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

    def __init__(self, url: str, on_open: Callable[[Any], object] | None = None) -> None:
        self.url = url
        self._on_open = on_open  # e.g. the migrations, on every new connection
        self._lock = threading.Lock()
        self._conn: Any = None

    def _connected(self) -> Any:
        if self._conn is None or self._conn.closed:
            conn = pg_connect(self.url)
            conn.autocommit = True
            try:
                if self._on_open is not None:
                    self._on_open(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def connect(self) -> None:
        """Open the connection now (raises what opening raises)."""
        with self._lock:
            self._connected()

    def transaction(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(cursor, *args)`` in one transaction."""
        return self._use(fn, args, transaction=True)

    def autocommit(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(connection, *args)``, each statement its own transaction."""
        return self._use(fn, args, transaction=False)

    def _use(self, fn: Callable[..., _T], args: tuple[Any, ...], *, transaction: bool) -> _T:
        with self._lock:
            conn = self._connected()
            try:
                if not transaction:
                    return fn(conn, *args)
                with conn.transaction(), conn.cursor() as cur:
                    return fn(cur, *args)
            except Exception:
                conn.close()
                self._conn = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
