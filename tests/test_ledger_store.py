"""The SQLite ledger: durability, flush semantics, exact money, several processes."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.open import open_ledger
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.schema import SCHEMA_VERSION
from gateway.ledger.sqlite import TABLE, ledger_path, read_rows, with_lock_retry
from gateway.ledger.store import SQLiteLedger

REPO = Path(__file__).resolve().parents[1]


def make_row(i: int = 0, **kw: object) -> LedgerRow:
    base = LedgerRow(
        request_id=f"req-{i}",
        ts=1_700_000_000.0 + i,
        tenant="acme",
        key_id="0123456789ab",
        route="auto",
        requested_model="auto",
        served_model="gpt-4o-mini",
        provider="openai",
        endpoint="chat",
        stream=False,
        cache_status="miss",
        input_tokens=100,
        cached_tokens=None,
        cache_write_tokens=None,
        output_tokens=20,
        usage_estimated=False,
        cost_usd=Decimal("0.0000270000"),
        baseline_cost_usd=Decimal("0.0004500000"),
        latency_ms=12.5,
        ttft_ms=None,
        status="ok",
        http_status=200,
        error_code=None,
        attempts=1,
        classifier_score=0.25,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def reader(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(str(path), timeout=5)
    try:
        yield conn
    finally:
        conn.close()


def count(path: Path) -> int:
    with reader(path) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {TABLE}").fetchone()[0])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SQLiteLedger]:
    led = SQLiteLedger(tmp_path / "sub" / "ledger.db")
    led.start()
    try:
        yield led
    finally:
        led.close()


def test_schema_wal_and_migrations(ledger: SQLiteLedger) -> None:
    with reader(ledger.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [
            (v,) for v in range(1, SCHEMA_VERSION + 1)
        ]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"ledger_rollup_hour", "ledger_rollup_day", "ledger_rollup_mark"} <= tables
    assert "ix_ledger_conversation_ts_cost" in names and "ix_ledger_conversation_ts" not in names  # v9
    assert {"ix_ledger_ts_conversation_tenant", "ux_ledger_request_id"} <= names  # v10
    assert "ix_ledger_ts_conversation" not in names  # v10 replaced it
    assert "ix_ledger_ts" not in names  # v5: the covering ts index replaced it
    assert not names & {  # v7: no report walks them, every insert paid for them
        "ix_ledger_tenant_ts",
        "ix_ledger_served_model_ts",
        "ix_ledger_key_ts",
        "ix_ledger_route_ts",
        "ix_ledger_tenant_model_ts",
    }
    assert ledger.healthy()


def test_second_start_on_same_file_is_idempotent(ledger: SQLiteLedger) -> None:
    other = SQLiteLedger(ledger.path)
    other.start()
    other.write(make_row(1))
    other.close()
    with reader(ledger.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
    assert count(ledger.path) == 1


def test_10k_rows_from_4_threads_all_present_after_close(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()

    def worker(t: int) -> None:
        for i in range(2500):
            led.write(make_row(t * 10_000 + i))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    led.close()
    assert not led.healthy()
    with reader(led.path) as conn:
        ids = {r[0] for r in conn.execute(f"SELECT request_id FROM {TABLE}")}
    assert len(ids) == 10_000
    assert ids == {f"req-{t * 10_000 + i}" for t in range(4) for i in range(2500)}
    assert led.dropped() == 0


def test_flush_commits_everything_queued_so_far(tmp_path: Path) -> None:
    # A long linger: without flush() nothing would be committed for 30 s.
    led = SQLiteLedger(tmp_path / "ledger.db", batch_size=10_000, flush_interval=30.0)
    led.start()
    try:
        for i in range(100):
            led.write(make_row(i))
        started = time.monotonic()
        assert led.flush(timeout=5.0)
        assert time.monotonic() - started < 2.0
        assert led.pending() == 0
        assert count(led.path) == 100
        assert led.flush()  # nothing pending: immediate success
    finally:
        led.close()


def test_flush_without_writer(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    assert led.flush(timeout=0.1)  # nothing queued
    led.write(make_row())
    assert led.pending() == 1
    assert not led.flush(timeout=0.1)  # not started: cannot commit
    led.start()
    assert led.flush()
    led.close()
    assert count(led.path) == 1


def test_batches_commit_without_flush(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db", batch_size=8, flush_interval=0.01)
    led.start()
    try:
        for i in range(20):
            led.write(make_row(i))
        deadline = time.monotonic() + 5
        while count(led.path) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert count(led.path) == 20
    finally:
        led.close()


def test_decimal_and_none_round_trip(ledger: SQLiteLedger) -> None:
    rows = [
        make_row(1, cost_usd=Decimal("0.0000000001"), baseline_cost_usd=Decimal("123456789.1234567891")),
        make_row(2, cost_usd=Decimal("0E-10"), baseline_cost_usd=None),
        make_row(
            3,
            cost_usd=None,
            input_tokens=None,
            output_tokens=None,
            cached_tokens=0,
            cache_write_tokens=7,
            ttft_ms=3.25,
            stream=True,
            usage_estimated=True,
            classifier_score=None,
            key_id=None,
            route=None,
            served_model=None,
            provider=None,
            status="error",
            http_status=502,
            error_code="upstream_error",
            attempts=3,
        ),
    ]
    for r in rows:
        ledger.write(r)
    assert ledger.flush()
    with reader(ledger.path) as conn:
        back = read_rows(conn)
        raw = conn.execute(f"SELECT typeof(cost_usd), cost_usd FROM {TABLE} ORDER BY id").fetchall()
    assert back == rows
    assert back[0].cost_usd == Decimal("0.0000000001")
    assert str(back[1].cost_usd) == "0E-10"
    assert raw[0] == ("text", "0.0000000001")
    assert raw[2] == ("null", None)


def test_write_after_close_is_dropped_not_raised(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    led.write(make_row(1))
    led.close()
    led.write(make_row(2))  # must not raise
    assert led.dropped() == 1
    led.close()  # idempotent
    assert count(led.path) == 1


def test_max_pending_bounds_memory(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db", max_pending=5)  # never started
    for i in range(8):
        led.write(make_row(i))
    assert led.pending() == 5
    assert led.dropped() == 3
    led.close(timeout=0.1)


def test_open_ledger_urls(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "ledger.db"
    assert ledger_path(f"sqlite:///{target}") == target
    assert ledger_path(str(target)) == target
    assert ledger_path("sqlite:///rel/ledger.db") == Path("rel/ledger.db")
    pg = open_ledger("postgresql://user@localhost/db", home=tmp_path / "home")
    assert isinstance(pg, PostgresLedger)  # not started: nothing is opened or created yet
    assert pg.path == tmp_path / "home" / "ledger-outbox.db" and not pg.path.exists()
    with pytest.raises(ValueError, match="names no SQLite file"):
        ledger_path("postgresql://user@localhost/db")
    with pytest.raises(ValueError):
        open_ledger("mysql://x/y")
    with pytest.raises(ValueError):
        open_ledger("sqlite://")
    led = open_ledger(f"sqlite:///{target}", batch_size=4)
    led.start()  # creates the parent directories
    led.write(make_row())
    led.close()
    assert count(target) == 1


_CHILD_WRITER = textwrap.dedent(
    """
    import sys
    from dataclasses import replace
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from tests.test_ledger_store import make_row
    from gateway.ledger.store import SQLiteLedger
    led = SQLiteLedger(Path(sys.argv[1]), batch_size=64, flush_interval=0.001)
    led.start()
    for i in range(3000):
        led.write(make_row(100_000 + i, tenant="child"))
    led.close()
    print("child done", led.dropped())
    """
)

_CHILD_READER = textwrap.dedent(
    """
    import sqlite3, sys, time
    sys.path.insert(0, sys.argv[2])
    from gateway.ledger.report import spend
    seen = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        lines = spend(sys.argv[1], "tenant", None)
        seen.append(sum(ln.requests for ln in lines))
        if seen[-1] >= 3000:
            break
        time.sleep(0.005)
    assert seen == sorted(seen), seen
    print("reader saw", seen[0], seen[-1])
    """
)


def test_other_processes_read_and_write_concurrently(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    led = SQLiteLedger(path, batch_size=64, flush_interval=0.001)
    led.start()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), str(REPO)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for code in (_CHILD_READER, _CHILD_WRITER)
    ]
    for i in range(3000):
        led.write(make_row(i))
        if i % 100 == 0:
            time.sleep(0.002)
    outs = [p.communicate(timeout=60) for p in procs]
    led.close()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert "child done 0" in outs[1][0]
    with reader(path) as conn:
        per_tenant = dict(conn.execute(f"SELECT tenant, COUNT(*) FROM {TABLE} GROUP BY tenant").fetchall())
    assert per_tenant == {"acme": 3000, "child": 3000}


def test_write_cost(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    rows = [make_row(i) for i in range(10_000)]
    try:
        started = time.perf_counter()
        for r in rows:
            led.write(r)
        elapsed = time.perf_counter() - started
        assert led.flush(timeout=30)
    finally:
        led.close()
    print(f"\nSQLiteLedger.write(): {elapsed / len(rows) * 1e6:.2f} µs mean over {len(rows)} calls")
    assert count(led.path) == 10_000


def test_transient_failures_are_retried_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db", flush_interval=0.001)
    led.start()
    real_insert = led._insert
    failures = {"left": 3}
    health_while_failing: list[bool] = []

    def flaky(batch: list[LedgerRow]) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            if failures["left"] == 0:
                health_while_failing.append(led.healthy())
            raise sqlite3.OperationalError("database is locked")
        real_insert(batch)

    monkeypatch.setattr(led, "_insert", flaky)
    try:
        led.write(make_row(1))
        assert led.flush(timeout=10)
        assert health_while_failing == [False]
        assert led.healthy()
        assert led.last_error is None
    finally:
        led.close()
    assert count(led.path) == 1


def test_rejected_row_is_skipped_not_poisoning_the_batch(tmp_path: Path) -> None:
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    try:
        led.write(make_row(1))
        led.write(make_row(2, tenant=object()))  # cannot be bound: dropped alone
        led.write(make_row(3))
        assert led.flush()
        assert led.dropped() == 1
        assert led.healthy()
    finally:
        led.close()
    assert count(led.path) == 2


def test_external_write_lock_only_delays(ledger: SQLiteLedger) -> None:
    with reader(ledger.path) as other:
        other.execute("BEGIN IMMEDIATE")
        ledger.write(make_row(1))
        time.sleep(0.3)
        assert count(ledger.path) == 0
        other.execute("ROLLBACK")
    assert ledger.flush()
    assert count(ledger.path) == 1


def test_start_up_lock_retries_wait_out_another_process_only_with_patience() -> None:
    """A writer starting while another process migrates or back-fills a big ledger (minutes)
    waits for it (``patience_s``) instead of giving up after the usual attempts."""
    calls = 0

    def locked_for(n: int) -> str:
        nonlocal calls
        calls += 1
        if calls <= n:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        with_lock_retry(lambda: locked_for(30), attempts=5, delay=0.0001)
    assert calls == 5
    calls = 0
    assert with_lock_retry(lambda: locked_for(30), attempts=5, delay=0.0001, patience_s=30) == "done"
    assert calls == 31
    calls, t0 = 0, time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        with_lock_retry(lambda: locked_for(10**9), attempts=5, delay=0.0001, patience_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3
    calls = 0

    def broken() -> None:
        nonlocal calls
        calls += 1
        raise sqlite3.OperationalError("no such table: x")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        with_lock_retry(broken, patience_s=30)
    assert calls == 1
