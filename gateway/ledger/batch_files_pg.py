"""The Files API's storage in PostgreSQL (core.ports_batch.FileStore), for replicas that share the
ledger's database: a file uploaded through one replica (a batch's input) or written by the one
that finished a batch (its output and error files) reads the same through every other. The
table comes with the ledger's migrations (v14); each file is one row (metadata and bytes), so
an upload is whole or absent. Another tenant's file id reads as absent."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.ledger.file_meta import new_file, valid_id
from gateway.ledger.pg_conn import PgConn
from gateway.ledger.schema import FILES_TABLE


class PgFileStore:
    def __init__(self, url: str) -> None:
        self._db = PgConn(url)

    async def put(self, tenant: str, purpose: str, filename: str, data: bytes) -> dict[str, Any]:
        meta = new_file(purpose, filename, len(data))

        def work(cur: Any) -> None:
            cur.execute(
                f"INSERT INTO {FILES_TABLE} (tenant, id, purpose, created_at, meta, data) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (tenant, meta["id"], purpose, meta["created_at"], orjson.dumps(meta), data),
            )

        await asyncio.to_thread(self._db.transaction, work)
        return meta

    async def _one(self, column: str, tenant: str, file_id: str) -> bytes | None:
        """One file's ``meta`` or ``data`` (None: no such file of this tenant)."""
        if not valid_id(file_id):
            return None

        def work(cur: Any) -> Any:
            cur.execute(
                f"SELECT {column} FROM {FILES_TABLE} WHERE tenant = %s AND id = %s", (tenant, file_id)
            )
            return cur.fetchone()

        row = await asyncio.to_thread(self._db.transaction, work)
        return None if row is None else bytes(row[0])

    async def get(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        meta = await self._one("meta", tenant, file_id)
        return None if meta is None else dict(orjson.loads(meta))

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        return await self._one("data", tenant, file_id)

    async def listing(self, tenant: str, purpose: str | None) -> list[dict[str, Any]]:
        """The tenant's files (of ``purpose``), newest first."""
        sql = f"SELECT meta FROM {FILES_TABLE} WHERE tenant = %s"
        args: tuple[str, ...] = (tenant,)
        if purpose is not None:
            sql, args = sql + " AND purpose = %s", (tenant, purpose)
        sql += " ORDER BY created_at DESC, id DESC"

        def work(cur: Any) -> list[Any]:
            cur.execute(sql, args)
            return list(cur.fetchall())

        rows = await asyncio.to_thread(self._db.transaction, work)
        return [dict(orjson.loads(bytes(r[0]))) for r in rows]

    async def delete(self, tenant: str, file_id: str) -> bool:
        if not valid_id(file_id):
            return False

        def work(cur: Any) -> int:
            cur.execute(f"DELETE FROM {FILES_TABLE} WHERE tenant = %s AND id = %s", (tenant, file_id))
            return int(cur.rowcount)

        return await asyncio.to_thread(self._db.transaction, work) > 0

    def close(self) -> None:
        self._db.close()
