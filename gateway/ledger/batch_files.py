"""The Files API's storage (core.ports_batch.FileStore) for one process (with a PostgreSQL ledger
``open_file_store`` takes the database's, shared by replicas): a local directory,
``<SWITCHYARD_HOME>/files``, one folder per tenant (named by a hash of the tenant, so a
tenant's name never becomes a path), each file beside its metadata (``<id>.json``). Writes
go to a temporary name, are fsynced and renamed into place: a crash leaves a whole file or
none. Another tenant's file id reads as absent."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

from gateway.core.ports_batch import FileStore
from gateway.ledger.batch_files_pg import PgFileStore
from gateway.ledger.file_meta import new_file, valid_id
from gateway.ledger.sqlite import is_postgres_url


def _tenant_dir(root: Path, tenant: str) -> Path:
    return root / hashlib.blake2b(tenant.encode(), digest_size=12).hexdigest()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LocalFileStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(self, tenant: str, purpose: str, filename: str, data: bytes) -> dict[str, Any]:
        meta = new_file(purpose, filename, len(data))

        def write() -> None:
            folder = _tenant_dir(self.root, tenant)
            folder.mkdir(parents=True, exist_ok=True)
            _write(folder / f"{meta['id']}.data", data)
            _write(folder / f"{meta['id']}.json", orjson.dumps(meta))

        await asyncio.to_thread(write)
        return meta

    def _meta(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        if not valid_id(file_id):
            return None
        try:
            meta: dict[str, Any] = orjson.loads(
                (_tenant_dir(self.root, tenant) / f"{file_id}.json").read_bytes()
            )
        except FileNotFoundError:
            return None
        return meta

    async def get(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._meta, tenant, file_id)

    async def content(self, tenant: str, file_id: str) -> bytes | None:
        def read() -> bytes | None:
            if self._meta(tenant, file_id) is None:
                return None
            try:
                return (_tenant_dir(self.root, tenant) / f"{file_id}.data").read_bytes()
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(read)

    async def listing(self, tenant: str, purpose: str | None) -> list[dict[str, Any]]:
        """The tenant's files (of ``purpose``), newest first."""

        def scan() -> list[dict[str, Any]]:
            folder = _tenant_dir(self.root, tenant)
            out = []
            for path in folder.glob("file-*.json") if folder.is_dir() else ():
                with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
                    meta = orjson.loads(path.read_bytes())
                    if purpose is None or meta.get("purpose") == purpose:
                        out.append(meta)
            out.sort(key=lambda m: (m["created_at"], m["id"]), reverse=True)
            return out

        return await asyncio.to_thread(scan)

    async def delete(self, tenant: str, file_id: str) -> bool:
        def remove() -> bool:
            if self._meta(tenant, file_id) is None:
                return False
            folder = _tenant_dir(self.root, tenant)
            (folder / f"{file_id}.json").unlink(missing_ok=True)
            (folder / f"{file_id}.data").unlink(missing_ok=True)
            return True

        return await asyncio.to_thread(remove)

    def close(self) -> None:
        return None


def open_file_store(ledger_url: str, home: Path) -> FileStore:
    """With a PostgreSQL ledger the files live in its database (every replica reads them);
    else in ``home/files``."""
    if is_postgres_url(ledger_url):
        return PgFileStore(ledger_url)
    return LocalFileStore(home / "files")
