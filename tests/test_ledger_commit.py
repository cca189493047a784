"""Group commit: submit() futures, idempotent inserts, schema v1 -> v2 migration."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.ledger.report import spend
from gateway.ledger.schema import ROLLUP_MARK, SCHEMA_VERSION, SQLITE_MIGRATIONS, TABLE
from gateway.ledger.sqlite import money_e10, read_rows
from gateway.ledger.store import ROLL_INTERVAL_S, SQLiteLedger
from tests.test_ledger_store import count, make_row, reader


async def test_submit_resolves_after_the_row_is_committed(tmp_path: Path) -> None:
    # A 30 s linger: only a waiting submitter makes the writer commit at once.
    led = SQLiteLedger(tmp_path / "ledger.db", flush_interval=30.0)
    led.start()
    try:
        started = time.monotonic()
        futures = [led.submit(make_row(i)) for i in range(200)]
        assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [True] * 200
        assert time.monotonic() - started < 2.0
        assert count(led.path) == 200  # visible to another connection: committed
    finally:
        led.close()


async def test_group_commit_uses_few_transactions(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db", batch_size=512)
    led.start()
    commits = 0
    real_insert = led._insert

    def counting(batch: list) -> None:  # type: ignore[type-arg]
        nonlocal commits
        commits += 1
        real_insert(batch)

    led._insert = counting  # type: ignore[method-assign]
    try:
        futures = [led.submit(make_row(i)) for i in range(2000)]
        assert all(await asyncio.gather(*futures))
    finally:
        led.close()
    assert commits <= 50, commits  # 2000 rows, not 2000 transactions


async def test_a_failing_disk_releases_waiters_after_wait_timeout(tmp_path: Path) -> None:
    # The writer's path (the failure is injected there; an in-place commit on a failing disk
    # falls back to it: test_a_held_write_lock_...).
    led = SQLiteLedger(tmp_path / "ledger.db", wait_timeout=0.3, inline_commits=False)
    led.start()
    broken = {"on": True}
    real_insert = led._insert

    def failing(batch: list) -> None:  # type: ignore[type-arg]
        if broken["on"]:
            raise sqlite3.OperationalError("disk I/O error")
        real_insert(batch)

    led._insert = failing  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        assert await asyncio.wait_for(led.submit(make_row(1)), 5) is False
        assert 0.25 <= time.monotonic() - started < 3
        assert not led.healthy()
        broken["on"] = False  # the writer kept the row and retries it
        assert await asyncio.to_thread(led.flush, 10)
        assert count(led.path) == 1 and led.healthy()
    finally:
        led.close()


async def test_rows_of_one_loop_turn_are_committed_together_on_the_loop(tmp_path: Path) -> None:
    # A 30 s linger: a row the writer took would still be committed at once (a waiter).
    led = SQLiteLedger(tmp_path / "ledger.db", flush_interval=30.0)
    led.start()
    try:
        first = led.submit(make_row(1))
        second = led.submit(make_row(2))  # the same turn of the loop: the same transaction
        assert not first.done() and count(led.path) == 0  # committed at the end of the turn
        await asyncio.sleep(0)
        assert first.done() and second.done() and first.result() is True and second.result() is True
        assert count(led.path) == 2 and led.inline_commits == 2  # visible to another connection
        assert await led.submit(make_row(2)) is True  # the same request id again: stored once
        assert count(led.path) == 2 and led.inline_commits == 3
        led.write(make_row(3))  # fire and forget: queued, the writer lingers (30 s)
        behind = led.submit(make_row(4))  # the writer has rows: it takes this one too, at once
        await asyncio.sleep(0)
        assert not behind.done()
        assert await asyncio.wait_for(behind, 5) is True
        assert count(led.path) == 4 and led.inline_commits == 3
    finally:
        led.close()


async def test_one_loop_turn_commits_at_most_a_batch_on_the_loop(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db", batch_size=2)
    led.start()
    try:
        futs = [led.submit(make_row(i)) for i in range(3)]  # the third: the writer's
        assert await asyncio.wait_for(asyncio.gather(*futs), 5) == [True, True, True]
        assert count(led.path) == 3 and led.inline_commits == 2
    finally:
        led.close()


async def test_a_flush_or_close_takes_rows_waiting_for_the_loop(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    try:
        fut = led.submit(make_row(1))
        assert led.pending() == 1
        assert led.flush(5)  # on the loop's own thread: the row goes to the writer
        assert count(led.path) == 1
        assert await asyncio.wait_for(fut, 5) is True
        late = led.submit(make_row(2))
        led.close()  # before the loop's turn ends
        assert count(led.path) == 2
        assert await asyncio.wait_for(late, 5) is True
    finally:
        led.close()


async def test_a_held_write_lock_sends_the_row_to_the_writer_without_blocking(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    other = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction
        fut = led.submit(make_row(1))
        started = time.perf_counter()
        await asyncio.sleep(0)  # the loop's commit meets the lock: no wait on the event loop
        assert time.perf_counter() - started < 0.05
        assert not fut.done() and led.inline_commits == 0
        await asyncio.sleep(0.3)
        assert not fut.done()  # the writer waits for the lock
        other.execute("COMMIT")
        assert await asyncio.wait_for(fut, 10) is True
        assert count(led.path) == 1 and led.inline_commits == 0
    finally:
        other.close()
        led.close()


async def test_rows_committed_in_place_are_rolled_up_without_a_flush(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    try:
        await asyncio.sleep(ROLL_INTERVAL_S * 3)  # past the roll a starting writer makes anyway
        for i in range(5):
            await asyncio.sleep(0.002)
            assert await led.submit(make_row(i)) is True
        assert led.inline_commits >= 3  # a row meeting a roll (the lock held) takes the writer

        def through() -> int:
            with reader(led.path) as conn:
                return int(conn.execute(f"SELECT through FROM {ROLLUP_MARK}").fetchone()[0])

        deadline = time.monotonic() + ROLL_INTERVAL_S * 20
        while through() < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert through() == 5  # the writer rolled the rows it never committed itself
        (line,) = spend(led.path, "tenant", None)
        assert line.requests == 5
        await asyncio.sleep(ROLL_INTERVAL_S * 3)
        assert led._asleep  # idle: the writer waits untimed (no wake-ups) ...
        assert await led.submit(make_row(5)) is True
        deadline = time.monotonic() + ROLL_INTERVAL_S * 20
        while through() < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert through() == 6  # ... and the next in-place row wakes it to roll up
    finally:
        led.close()


async def test_submit_after_close_resolves_false(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    led.close()
    assert await led.submit(make_row(1)) is False
    assert led.dropped() == 1


async def test_cancelled_waiter_does_not_break_the_writer(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    try:
        fut = led.submit(make_row(1))
        fut.cancel()
        assert await led.submit(make_row(2)) is True
        assert led.healthy()
    finally:
        led.close()
    assert count(led.path) == 2


def test_same_request_id_twice_is_stored_once(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    led.write(make_row(1))
    led.write(make_row(1, cost_usd=Decimal("9")))  # a replay: ignored, not an error
    led.write(make_row(2))
    led.close()
    with reader(led.path) as conn:
        rows = read_rows(conn)
    assert [r.request_id for r in rows] == ["req-1", "req-2"]
    assert rows[0].cost_usd == Decimal("0.0000270000")
    assert led.dropped() == 0


def test_money_is_stored_exact_twice(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    led.write(
        make_row(1, cost_usd=Decimal("123456.0000000001"), savings_cause="routing", route_decision="weak")
    )
    led.close()
    with reader(led.path) as conn:
        text, e10, cause, decision = conn.execute(
            f"SELECT cost_usd, cost_e10, savings_cause, route_decision FROM {TABLE}"
        ).fetchone()
        (row,) = read_rows(conn)
    assert (text, e10) == ("123456.0000000001", 1_234_560_000_000_001)
    assert (cause, decision) == ("routing", "weak")
    assert (row.savings_cause, row.route_decision) == ("routing", "weak")
    assert money_e10(None) is None


def test_v1_ledger_is_migrated_in_place(tmp_path: Path) -> None:
    """A ledger written before v2 (with a duplicate request id) keeps its rows, gains the new
    columns, the e10 money copies and the unique index; reports read it right away."""
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for stmt in SQLITE_MIGRATIONS[1]:
        conn.execute(stmt)
    conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
    cols = "request_id, ts, tenant, requested_model, endpoint, stream, cache_status, usage_estimated, "
    cols += "latency_ms, status, http_status, attempts, cost_usd, baseline_cost_usd"
    for rid, cost in (("a", "0.0000000003"), ("a", "5"), ("b", None)):
        conn.execute(
            f"INSERT INTO {TABLE} ({cols}) VALUES (?, ?, 't', 'm', 'chat', 0, 'miss', 0, 1, 'ok', 200, 1, ?, '0.5')",
            (rid, time.time(), cost),
        )
    conn.commit()
    conn.close()
    (line,) = spend(path, "tenant", None)  # a report migrates an old file before reading
    assert line.requests == 2 and line.cost_usd == Decimal("0.0000000003")
    assert line.baseline_cost_usd == Decimal("1.0000000000")
    assert line.unpriced == 1
    led = SQLiteLedger(path)
    led.start()  # and the writer finds it up to date
    led.write(make_row(1))
    led.close()
    with reader(path) as conn:
        assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute(f"SELECT cost_e10 FROM {TABLE} WHERE request_id = 'a'").fetchone()[0] == 3
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                f"INSERT INTO {TABLE} ({cols}) VALUES ('a', 0, 't', 'm', 'chat', 0, 'miss', 0, 1, 'ok', 200, 1, NULL, NULL)"
            )


async def test_null_ledger_for_benchmarks_records_nothing(tmp_path: Path) -> None:
    from gateway.ledger.null import NullLedger
    from gateway.ledger.open import open_ledger

    led = open_ledger("none")
    assert isinstance(led, NullLedger)
    led.start()
    assert led.healthy() and await led.submit(make_row(1)) is False
    led.write(make_row(2))
    assert led.flush() and led.pending() == 0 and led.spent_since("tenant", 0) == {}
    led.close()
    assert not led.healthy()
