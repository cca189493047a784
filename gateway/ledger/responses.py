"""The Responses API's conversation store (core.ports.ResponseStore) in SQLite, or in
PostgreSQL when the ledger is there (``open_response_store``): one row per stored response
(the Response object, its own input items, the id of the response it continued), per tenant,
kept for a TTL. Expired rows read as absent and are swept on later writes.

A conversation is the chain of ``previous_response_id`` links, read in one recursive query:
each row keeps only its own items, so storage grows linearly with the conversation. A chain
with a missing (expired, deleted) link cannot be continued.

One connection behind a lock; the calls run off the event loop (``asyncio.to_thread``). Writes
are committed in groups: the puts that arrive while one transaction runs are committed together
in the next, by the same worker (one thread hand-off and one commit per group, not per
response); each put returns once its row is committed, so a ``previous_response_id`` sent
after the answer always finds it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.ledger.pg_conn import PgConn
from gateway.ledger.postgres import pg_migrate
from gateway.ledger.schema import stored_responses_sql
from gateway.ledger.sqlite import connect, is_postgres_url

log = logging.getLogger("switchyard")
DEFAULT_TTL_S: Final = 30 * 24 * 3600.0
SWEEP_EVERY_S: Final = 60.0
MAX_CHAIN: Final = 10_000  # links followed at most (a cycle cannot be built, but bound it anyway)

_PUT = (
    "INSERT INTO stored_responses VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, id) DO UPDATE"
    " SET response = excluded.response, expires_at = excluded.expires_at"
)
_GET = "SELECT response, input_items FROM stored_responses WHERE tenant = ? AND id = ? AND expires_at >= ?"
_CHAIN = f"""
WITH RECURSIVE chain(id, previous_id, depth, response, input_items) AS (
    SELECT id, previous_id, 0, response, input_items FROM stored_responses
    WHERE tenant = ? AND id = ? AND expires_at >= ?
    UNION ALL
    SELECT r.id, r.previous_id, c.depth + 1, r.response, r.input_items
    FROM stored_responses r JOIN chain c ON r.id = c.previous_id
    WHERE r.tenant = ? AND r.expires_at >= ? AND c.depth < {MAX_CHAIN}
)
SELECT previous_id, response, input_items FROM chain ORDER BY depth DESC
"""
_DELETE = "DELETE FROM stored_responses WHERE tenant = ? AND id = ? AND expires_at >= ?"
_SWEEP = "DELETE FROM stored_responses WHERE expires_at < ?"


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]


class _Store:
    """The store over one DB-API connection; subclasses open it and spell the placeholders."""

    placeholder = "?"

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._swept = 0.0
        self._queue = _PutQueue(self._put_many)

    @property
    def commits(self) -> int:
        """Write transactions so far (each commits one group of puts)."""
        return self._queue.commits

    def _run(self, sql: str, params: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def _run_many(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """``sql`` once per row, in one transaction."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Have the schema in place before the first request (blocking: call off the loop)."""

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    async def put(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
        previous_id: str | None,
    ) -> None:
        now = time.time()
        row = (
            str(response["id"]),
            tenant,
            previous_id,
            float(response.get("created_at") or now),
            now + self.ttl_s,
            orjson.dumps(response),
            orjson.dumps(list(input_items)),
        )
        await self._queue.put(row)

    def _put_many(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._run_many(self._sql(_PUT), rows)
        now = time.time()
        if now - self._swept > SWEEP_EVERY_S:
            self._swept = now
            self._run(self._sql(_SWEEP), (now,))

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        rows = await asyncio.to_thread(self._run, self._sql(_GET), (tenant, response_id, time.time()))
        return None if not rows else Stored(orjson.loads(rows[0][0]), orjson.loads(rows[0][1]))

    async def conversation(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to ``response_id``'s output, oldest first; None when
        it is not stored or a link of its chain is missing."""
        now = time.time()
        rows = await asyncio.to_thread(self._run, self._sql(_CHAIN), (tenant, response_id, now, tenant, now))
        if not rows or rows[0][0] is not None:  # not found, or the oldest row still has a parent
            return None
        items: list[dict[str, Any]] = []
        for _, response, inputs in rows:
            items += orjson.loads(inputs)
            items += orjson.loads(response).get("output", [])
        return items

    async def delete(self, tenant: str, response_id: str) -> bool:
        count = await asyncio.to_thread(self._run, self._sql(_DELETE), (tenant, response_id, time.time()))
        return bool(count)


class _PutQueue:
    """Group commit: ``put`` waits for its row's transaction; the rows that arrive while a
    transaction runs go in the next one, on the same worker thread, which stops when no row
    waits. A failed transaction fails the puts of its group (their rows are not stored)."""

    def __init__(self, write: Callable[[Sequence[tuple[Any, ...]]], None]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._waiting: list[tuple[tuple[Any, ...], asyncio.Future[None]]] = []
        self._draining = False
        self.commits = 0

    async def put(self, row: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiting.append((row, done))
            start, self._draining = not self._draining, True
        if start:
            loop.run_in_executor(None, self._drain)  # the executor holds the running drain
        await done

    def _drain(self) -> None:
        while True:
            with self._lock:
                group, self._waiting = self._waiting, []
                if not group:
                    self._draining = False
                    return
            error: BaseException | None = None
            try:
                self._write([row for row, _ in group])
                self.commits += 1
            except Exception as exc:
                error = exc
            by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
            for _, done in group:
                by_loop.setdefault(done.get_loop(), []).append(done)
            for owner, waiters in by_loop.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    owner.call_soon_threadsafe(_settle, waiters, error)


def _settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for done in waiters:
        if done.done():  # the request was cancelled meanwhile (its row is stored all the same)
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


class SqliteResponseStore(_Store):
    def __init__(self, path: Path, ttl_s: float = DEFAULT_TTL_S) -> None:
        super().__init__(ttl_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection = connect(path, check_same_thread=False)
        with self._conn:
            for stmt in stored_responses_sql("REAL", "BLOB"):
                self._conn.execute(stmt)

    def _run(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._lock, self._conn:
            cur = self._conn.execute(sql, params)
            return cur.fetchall() if sql.lstrip().startswith(("SELECT", "WITH")) else cur.rowcount

    def _run_many(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        with self._lock, self._conn:
            self._conn.executemany(sql, rows)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PgResponseStore(_Store):
    """The same store in PostgreSQL (when the ledger is there, so replicas share the
    conversations). The connection is opened at first use and reopened after a failure."""

    placeholder = "%s"

    def __init__(self, url: str, ttl_s: float = DEFAULT_TTL_S) -> None:
        super().__init__(ttl_s)
        self.url = url
        # the table is a migration, under the migrations' advisory lock
        self._db = PgConn(url, on_open=pg_migrate)

    def prepare(self) -> None:
        """Connect and bring the schema up to date now (at start-up; best effort: a database
        that is down is migrated by the first call that reaches it)."""
        try:
            self._db.connect()
        except Exception as exc:
            log.warning("stored responses: PostgreSQL not reachable at start-up (%s)", type(exc).__name__)

    def _run(self, sql: str, params: tuple[Any, ...]) -> Any:
        def run(conn: Any) -> Any:
            cur = conn.execute(sql, params)
            return cur.fetchall() if sql.lstrip().startswith(("SELECT", "WITH")) else cur.rowcount

        return self._db.autocommit(run)

    def _run_many(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        def run(cur: Any) -> None:
            cur.executemany(sql, rows)

        self._db.transaction(run)

    def close(self) -> None:
        self._db.close()


def open_response_store(ledger_url: str, home: Path) -> SqliteResponseStore | PgResponseStore:
    """PostgreSQL when the ledger is there, else SQLite in ``<home>/responses.db``."""
    if is_postgres_url(ledger_url):
        return PgResponseStore(ledger_url)
    return SqliteResponseStore(home / "responses.db")
