"""Virtual API keys in PostgreSQL, shared by every gateway replica that uses the same database.

Same interface and semantics as the SQLite ``KeyStore`` (all behaviour lives in
``KeyStoreBase``, the connection handling in ``SharedConnectionStore``); only the connection
itself differs. Chosen by ``stores.open_key_store`` when the ledger
URL is ``postgresql://``: the tables ``api_keys`` and ``key_limits`` are created there if
absent (serialised by an advisory lock, so replicas starting together do not race). psycopg
is imported lazily (``pip install 'switchyard[postgres]'``).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from gateway.limits.keys import SharedConnectionStore, schema_sql

if TYPE_CHECKING:
    import psycopg

_SCHEMA_LOCK: Final = 0x5359_4B45  # pg_advisory_xact_lock key ("SYKE"): one schema creator at a time
_CONNECT_TIMEOUT_S: Final = 2
_RETRY_AFTER_FAILURE_S: Final = 2.0  # fail fast meanwhile: callers must not queue on a dead server


class PostgresKeyStore(SharedConnectionStore["psycopg.Connection[Any]"]):
    """Keys in PostgreSQL (``url`` as for psycopg; ``options=-csearch_path=...`` picks a schema).

    One autocommit connection per process; a broken one (server restart) is replaced on the
    next call. After a failed connect, calls fail fast for a moment instead of queueing."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self._down_until = 0.0

    def _usable(self, conn: psycopg.Connection[Any]) -> bool:
        return not conn.closed

    def _open(self) -> psycopg.Connection[Any]:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise RuntimeError("keys in PostgreSQL need psycopg: pip install 'switchyard[postgres]'") from exc
        if time.monotonic() < self._down_until:
            raise psycopg.OperationalError("key store unreachable (retrying shortly)")
        try:
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
        except psycopg.Error:
            self._down_until = time.monotonic() + _RETRY_AFTER_FAILURE_S
            raise
        return conn

    @contextmanager
    def _cursor(self) -> Iterator[psycopg.Cursor[Any]]:
        with self._connection() as conn, conn.cursor() as cur:
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
