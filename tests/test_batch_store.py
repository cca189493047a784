"""The batch store on both databases (SQLite, and PostgreSQL under CI): an item is claimed
once, its result and ledger row are written together and only by the claim that holds it, a
lease that ran out hands the item to the next claim, a cancel ends what has not run, and the
rows still to hand to the ledger are given back until marked billed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.core.batch import Batch, NewItem
from gateway.ledger.batches import BatchStore, open_batch_store
from gateway.ledger.sqlite import connect, migrate


def _sqlite(tmp: Path) -> str:
    path = tmp / "ledger.db"
    conn = connect(path)
    migrate(conn)
    conn.close()
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchStore]:
    if request.param == "sqlite":
        s = open_batch_store(_sqlite(tmp_path))
        assert s is not None
        yield s
        s.close()
        return
    from gateway.ledger.pg import pg_connect
    from gateway.ledger.postgres import pg_migrate
    from tests.pg_support import scratch_schema

    with scratch_schema("sy_batches") as url:
        with pg_connect(url) as conn:
            pg_migrate(conn)
        s = open_batch_store(url)
        assert s is not None
        yield s
        s.close()


def _batch(bid: str = "batch_1") -> Batch:
    now = time.time()
    return Batch(bid, "team-a", "k1", "openai", "/v1/chat/completions", "small", "file-1", "24h", None,
                 "in_progress", now, now + 86400, {"in_progress_at": now})  # fmt: skip


def test_claim_complete_lease_and_billing(store: BatchStore) -> None:
    async def go() -> None:
        items = [NewItem(i, f"c{i}", b'{"model":"small"}') for i in range(5)]
        items.append(NewItem(5, "bad", None, "errored", b'{"error":{"code":"x","message":"y"}}'))
        await store.create(_batch(), items)
        assert await store.counts("batch_1") == {"pending": 5, "errored": 1}
        first = await store.claim("batch_1", 2, lease_s=60)
        assert [c.idx for c in first] == [0, 1] and all(c.attempt == 1 for c in first)
        second = await store.claim("batch_1", 10, lease_s=0.0)  # these leases run out at once
        assert [c.idx for c in second] == [2, 3, 4]
        assert await store.complete(first[0], "succeeded", b"{}", b'{"row":1}')
        assert not await store.complete(first[0], "succeeded", b"{}", b'{"row":1}')  # not twice
        await asyncio.sleep(0.01)
        again = await store.claim("batch_1", 10, lease_s=60)  # the dead worker's items
        assert [(c.idx, c.attempt) for c in again] == [(2, 2), (3, 2), (4, 2)]
        assert not await store.complete(second[0], "succeeded", b"{}", b"{}")  # its lease was taken over
        assert await store.complete(again[0], "errored", b'{"status_code":500}', b'{"row":2}')
        assert sorted(await store.unbilled(10)) == [
            ("batch_1", 0, b'{"row":1}'),
            ("batch_1", 2, b'{"row":2}'),
        ]
        await store.mark_billed([("batch_1", 0)])
        assert await store.unbilled(10) == [("batch_1", 2, b'{"row":2}')]
        await store.release(again[1:])
        b = await store.get("team-a", "batch_1")
        assert b is not None and await store.get("team-b", "batch_1") is None
        assert await store.close_pending("batch_1", "canceled", b'{"error":{}}') == 2  # 3 and 4
        assert await store.counts("batch_1") == {"succeeded": 1, "errored": 2, "canceled": 2, "running": 1}
        done = await store.results("batch_1", 0, 100)
        assert [(r.idx, r.status) for r in done] == [(0, "succeeded"), (2, "errored"), (3, "canceled"),
                                                     (4, "canceled"), (5, "errored")]  # fmt: skip
        b.status = "cancelling"
        await store.save(b)
        assert [x.id for x in await store.open_batches()] == ["batch_1"]
        assert [x.id for x in await store.page("team-a", "openai", None, 10)] == ["batch_1"]

    asyncio.run(go())


def test_a_send_cut_short_is_seen_by_the_next_claim(store: BatchStore) -> None:
    """``mark_sent`` before an upstream call: the claim that takes the item over after its
    worker died (lease over) or gave it back (a shutdown mid-call) knows it was sent."""

    async def go() -> None:
        await store.create(_batch(), [NewItem(i, f"c{i}", b"{}") for i in range(3)])
        first = await store.claim("batch_1", 3, 0.05)
        assert [c.interrupted for c in first] == [False, False, False]
        await store.mark_sent(first[0])  # sent, then the worker died
        await store.mark_sent(first[1])  # sent, then given back at a shutdown
        await store.release([first[1]])
        await asyncio.sleep(0.1)  # first[0] and first[2]'s leases run out
        again = {c.idx: c for c in await store.claim("batch_1", 3, 60)}
        assert {i: c.interrupted for i, c in again.items()} == {0: True, 1: True, 2: False}
        assert await store.complete(again[2], "succeeded", b'{"status_code": 200}', None)
        done = await store.results("batch_1", 0, 10)
        assert [(r.idx, r.result) for r in done] == [(2, b'{"status_code": 200}')]

    asyncio.run(go())
