"""The Responses API's conversation store (core.ports.ResponseStore) in SQLite, or in
PostgreSQL when the ledger is there (``open_response_store``): one row per
stored response (the Response object, its input items, the conversation items before it),
per tenant, kept for a TTL. Expired rows read as absent and are swept on later writes.

One connection behind a lock; the calls run off the event loop (``asyncio.to_thread``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.ledger.pg import pg_connect
from gateway.ledger.sqlite import connect, is_postgres_url

DEFAULT_TTL_S: Final = 30 * 24 * 3600.0
SWEEP_EVERY_S: Final = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    history BLOB NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at);
"""
_PG_SCHEMA = (
    _SCHEMA.replace("REAL", "DOUBLE PRECISION").replace("BLOB", "BYTEA").replace(";\nCREATE", "; CREATE")
)


def _row(
    tenant: str,
    response: dict[str, Any],
    input_items: Sequence[dict[str, Any]],
    history: Sequence[dict[str, Any]],
    ttl_s: float,
) -> tuple[Any, ...]:
    return (
        str(response["id"]),
        tenant,
        float(response.get("created_at") or time.time()),
        time.time() + ttl_s,
        orjson.dumps(response),
        orjson.dumps(list(input_items)),
        orjson.dumps(list(history)),
    )


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]


class SqliteResponseStore:
    def __init__(self, path: Path, ttl_s: float = DEFAULT_TTL_S) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self._conn = connect(path, check_same_thread=False)
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._swept = 0.0

    async def put(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
        history: Sequence[dict[str, Any]],
    ) -> None:
        await asyncio.to_thread(self._put, _row(tenant, response, input_items, history, self.ttl_s))

    def _put(self, row: tuple[Any, ...]) -> None:
        now = time.time()
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            if now - self._swept > SWEEP_EVERY_S:
                self._swept = now
                self._conn.execute("DELETE FROM responses WHERE expires_at < ?", (now,))

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        return await asyncio.to_thread(self._get, tenant, response_id)

    def _get(self, tenant: str, response_id: str) -> Stored | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT response, input_items, history FROM responses"
                " WHERE tenant = ? AND id = ? AND expires_at >= ?",
                (tenant, response_id, time.time()),
            ).fetchone()
        if row is None:
            return None
        return Stored(orjson.loads(row[0]), orjson.loads(row[1]), orjson.loads(row[2]))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, tenant, response_id)

    def _delete(self, tenant: str, response_id: str) -> bool:
        with self._lock, self._conn:
            cur = self._conn.execute(
                "DELETE FROM responses WHERE tenant = ? AND id = ? AND expires_at >= ?",
                (tenant, response_id, time.time()),
            )
            return cur.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PgResponseStore:
    """The same store in PostgreSQL (when the ledger is there, so replicas share the
    conversations). The connection is opened at first use and reopened after a failure."""

    def __init__(self, url: str, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self._conn: Any = None
        self._lock = threading.Lock()
        self._swept = 0.0

    def _run(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = pg_connect(self.url)
                self._conn.autocommit = True
                self._conn.execute(_PG_SCHEMA)
            try:
                return self._conn.execute(sql, params)
            except Exception:
                self._conn.close()
                self._conn = None
                raise

    async def put(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
        history: Sequence[dict[str, Any]],
    ) -> None:
        await asyncio.to_thread(self._put, _row(tenant, response, input_items, history, self.ttl_s))

    def _put(self, row: tuple[Any, ...]) -> None:
        self._run(
            "INSERT INTO responses VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, id) DO UPDATE"
            " SET response = EXCLUDED.response, expires_at = EXCLUDED.expires_at",
            row,
        )
        now = time.time()
        if now - self._swept > SWEEP_EVERY_S:
            self._swept = now
            self._run("DELETE FROM responses WHERE expires_at < %s", (now,))

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        return await asyncio.to_thread(self._get, tenant, response_id)

    def _get(self, tenant: str, response_id: str) -> Stored | None:
        row = self._run(
            "SELECT response, input_items, history FROM responses"
            " WHERE tenant = %s AND id = %s AND expires_at >= %s",
            (tenant, response_id, time.time()),
        ).fetchone()
        return (
            None if row is None else Stored(orjson.loads(row[0]), orjson.loads(row[1]), orjson.loads(row[2]))
        )

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, tenant, response_id)

    def _delete(self, tenant: str, response_id: str) -> bool:
        cur = self._run(
            "DELETE FROM responses WHERE tenant = %s AND id = %s AND expires_at >= %s",
            (tenant, response_id, time.time()),
        )
        return bool(cur.rowcount > 0)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def open_response_store(ledger_url: str, home: Path) -> SqliteResponseStore | PgResponseStore:
    """PostgreSQL when the ledger is there, else SQLite in ``<home>/responses.db``."""
    if is_postgres_url(ledger_url):
        return PgResponseStore(ledger_url)
    return SqliteResponseStore(home / "responses.db")
