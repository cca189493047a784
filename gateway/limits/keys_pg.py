"""Virtual API keys in PostgreSQL, shared by every gateway replica that uses the same database.

Same interface and semantics as the SQLite ``KeyStore`` (all behaviour lives in
``KeyStoreBase``); only the connection differs. Chosen by ``open_key_store`` when the ledger
URL is ``postgresql://``: the tables ``api_keys`` and ``key_limits`` are created there if
absent (serialised by an advisory lock, so replicas starting together do not race). psycopg
is imported lazily (``pip install 'switchyard[postgres]'``).
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from gateway.limits.keys import KeyStoreBase, schema_sql

if TYPE_CHECKING:
    import psycopg

_SCHEMA_LOCK: Final = 0x5359_4B45  # pg_advisory_xact_lock key ("SYKE"): one schema creator at a time
_CONNECT_TIMEOUT_S: Final = 2
_RETRY_AFTER_FAILURE_S: Final = 2.0  # fail fast meanwhile: callers must not queue on a dead server


class PostgresKeyStore(KeyStoreBase):
    """Keys in PostgreSQL (``url`` as for psycopg; ``options=-csearch_path=...`` picks a schema).

    One autocommit connection is opened lazily and shared by all threads under a lock; a
    broken connection (server restart) is replaced on the next call, and a forked child opens
    its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = 0
        self._down_until = 0.0

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def _open(self) -> psycopg.Connection[Any]:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise RuntimeError("keys in PostgreSQL need psycopg: pip install 'switchyard[postgres]'") from exc
        conn = psycopg.connect(
            self.url, connect_timeout=_CONNECT_TIMEOUT_S, application_name="switchyard", autocommit=True
        )
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for stmt in schema_sql("DOUBLE PRECISION"):
                    cur.execute(stmt)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _cursor(self) -> Iterator[psycopg.Cursor[Any]]:
        with self._lock:
            if self._conn is None or self._conn.closed or self._pid != os.getpid():
                import psycopg

                if time.monotonic() < self._down_until:
                    raise psycopg.OperationalError("key store unreachable (retrying shortly)")
                try:
                    self._conn = self._open()  # a connection inherited over fork is not reused
                except psycopg.Error:
                    self._down_until = time.monotonic() + _RETRY_AFTER_FAILURE_S
                    raise
                self._pid = os.getpid()
            with self._conn.cursor() as cur:
                yield cur

    def _rows(self, sql: str, params: tuple[object, ...]) -> builtins.list[tuple[Any, ...]]:
        with self._cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.fetchall()

    def _change(self, sql: str, params: tuple[object, ...]) -> int:
        with self._cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.rowcount

    def _insert_new(self, sql: str, params: tuple[object, ...]) -> bool:
        import psycopg

        try:
            self._change(sql, params)
        except psycopg.errors.UniqueViolation:
            return False
        return True
