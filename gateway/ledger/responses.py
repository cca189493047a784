"""The Responses API's conversation store (core.ports.ResponseStore) in SQLite: one row per
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

from gateway.ledger.sqlite import connect

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
        row = (
            str(response["id"]),
            tenant,
            float(response.get("created_at") or time.time()),
            time.time() + self.ttl_s,
            orjson.dumps(response),
            orjson.dumps(list(input_items)),
            orjson.dumps(list(history)),
        )
        await asyncio.to_thread(self._put, row)

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
