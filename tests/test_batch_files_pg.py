"""The Files API's files in PostgreSQL (gateway/ledger/batch_files_pg.py), as replicas sharing
the ledger's database use them: whole files back byte for byte, metadata as OpenAI's file
object, newest first, per purpose, another tenant's id absent, a bad id absent without a
query, a delete once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ledger.batch_files import LocalFileStore, open_file_store
from gateway.ledger.batch_files_pg import PgFileStore
from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import pg_migrate
from tests.pg_support import scratch_schema

pytestmark = pytest.mark.postgres


async def test_files_round_trip_per_tenant_in_postgres(tmp_path: Path) -> None:
    with scratch_schema("sy_files") as url:
        conn = pg_connect(url)
        try:
            pg_migrate(conn)
        finally:
            conn.close()
        store = open_file_store(url, tmp_path)
        assert isinstance(store, PgFileStore)
        try:
            data = bytes(range(256)) * 40  # not text: stored as bytes
            first = await store.put("acme", "batch", "in.jsonl", data)
            second = await store.put("acme", "batch_output", "out.jsonl", b"{}\n")
            assert first["object"] == "file" and first["bytes"] == len(data)
            assert await store.content("acme", first["id"]) == data
            assert await store.get("acme", first["id"]) == first
            assert await store.get("other", first["id"]) is None  # another tenant's: absent
            assert await store.content("other", first["id"]) is None
            assert await store.get("acme", "file-'; DROP TABLE x; --") is None
            ids = [m["id"] for m in await store.listing("acme", None)]
            assert set(ids) == {first["id"], second["id"]}
            assert [m["id"] for m in await store.listing("acme", "batch")] == [first["id"]]
            assert await store.listing("other", None) == []
            assert not await store.delete("other", first["id"])
            assert await store.delete("acme", first["id"])
            assert not await store.delete("acme", first["id"])
            assert await store.content("acme", first["id"]) is None
        finally:
            store.close()


def test_without_postgres_files_stay_in_the_home(tmp_path: Path) -> None:
    home = tmp_path
    store = open_file_store(str(home / "ledger.db"), home)
    assert isinstance(store, LocalFileStore) and store.root == home / "files"
