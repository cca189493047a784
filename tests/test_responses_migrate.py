"""The stored-responses table on PostgreSQL is a ledger migration, applied at start-up under
the migrations' advisory lock: replicas whose first Responses requests arrive together on a
fresh database all store their answers (no 500 after the upstream was paid)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from gateway.ledger.pg import pg_connect
from gateway.ledger.responses import PgResponseStore
from gateway.ledger.schema import POSTGRES_MIGRATIONS
from tests.pg_support import scratch_schema

pytestmark = pytest.mark.postgres


@pytest.fixture
def url() -> Iterator[str]:
    with scratch_schema("sy_respmig") as u:
        yield u


def tables(url: str) -> set[str]:
    with pg_connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    return {str(r[0]) for r in rows}


def test_prepare_creates_the_table_with_the_ledger_migrations(url: str) -> None:
    store = PgResponseStore(url)
    try:
        store.prepare()
        assert {"stored_responses", "schema_migrations", "ledger"} <= tables(url)
        with pg_connect(url) as conn:
            row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        assert row is not None and row[0] == max(POSTGRES_MIGRATIONS)
    finally:
        store.close()


def test_first_puts_on_several_replicas_at_once_all_succeed(url: str) -> None:
    n = 6
    stores = [PgResponseStore(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def first_use(i: int) -> None:
        barrier.wait()
        try:
            asyncio.run(stores[i].put("acme", {"id": f"resp_{i}", "output": []}, [], None))
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert errors == []
        got = asyncio.run(stores[0].get("acme", "resp_3"))
        assert got is not None and got.response["id"] == "resp_3"
    finally:
        for s in stores:
            s.close()
