"""The PostgreSQL ledger (outbox + shipper) against the real PostgreSQL server, and reports that
give the same answers on both stores. Each test works in its own PostgreSQL schema."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.bootstrap import seed_budgets
from gateway.config.policy import Policy
from gateway.core.ledger_row import LedgerRow
from gateway.flow.services import TaskOwner
from gateway.ledger.db import LedgerUnavailable
from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.query import spent_by, spent_since
from gateway.ledger.report import savings_by_cause, spend, spend_series, to_csv
from gateway.ledger.schema import SCHEMA_VERSION
from gateway.ledger.store import SQLiteLedger
from gateway.limits.gate import Limits
from tests.pg_support import scratch_schema
from tests.test_ledger_store import make_row

pytestmark = pytest.mark.postgres
D = Decimal
T0 = 1_764_460_800.0  # 2025-11-30T00:00:00Z


@pytest.fixture
def pg_url() -> Iterator[str]:
    with scratch_schema("sy_ledger") as url:
        yield url


def rows() -> list[LedgerRow]:
    hour = 3600.0
    return [
        make_row(1, ts=T0 + 10, cost_usd=D("0.0000000001"), baseline_cost_usd=D("0.0000000003"), savings_cause="routing"),
        make_row(2, ts=T0 + hour + 5, cost_usd=D("0.25"), baseline_cost_usd=D("0.5"), savings_cause="routing"),
        make_row(3, ts=T0 + 2 * hour, cost_usd=D("0E-10"), baseline_cost_usd=D("0.001"), cache_status="hit",
                 served_model=None, provider=None, savings_cause="exact_cache"),
        make_row(4, ts=T0 + 86_400 + 1, tenant="beta", key_id="k2", route="smart", served_model="gpt-4o",
                 cost_usd=D("1.5"), baseline_cost_usd=D("1.5")),
        make_row(5, ts=T0 + 86_400 * 40, tenant="beta", cost_usd=None, baseline_cost_usd=None,
                 input_tokens=None, output_tokens=None, status="error", http_status=502),
        make_row(6, ts=T0 + 86_400 * 40 + 7, provider="engine", served_model="llama", cost_usd=D("0.01"),
                 baseline_cost_usd=D("0.2"), savings_cause="self_hosted"),
    ]  # fmt: skip


def fill_sqlite(path: Path) -> None:
    led = SQLiteLedger(path)
    led.start()
    for r in rows():
        led.write(r)
    led.close()


def fill_postgres(url: str, home: Path) -> PostgresLedger:
    led = PostgresLedger(url, home / "outbox.db", idle_interval=0.05)
    led.start()
    for r in rows():
        led.write(r)
    assert led.ship_now(20), led.ship_error
    return led


def test_rows_arrive_once_with_migrations(pg_url: str, tmp_path: Path) -> None:
    led = fill_postgres(pg_url, tmp_path)
    try:
        led.write(rows()[0])  # the same request id again: stays one row
        assert led.ship_now(20)
        assert led.outbox_rows() == 0 and led.shipped == 7
    finally:
        led.close()
    with pg_connect(pg_url) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
        got = conn.execute(
            "SELECT request_id, cost_usd, savings_cause FROM ledger ORDER BY request_id"
        ).fetchall()
    assert [g[0] for g in got] == [f"req-{i}" for i in range(1, 7)]
    assert got[0][1] == D("0.0000000001") and got[4][1] is None
    assert got[5][2] == "self_hosted"
    with pg_connect(pg_url) as conn:  # v9: the covering conversation index; room for HOT span updates
        names = {
            r[0]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'ledger' AND schemaname = current_schema()"
            )
        }
        assert "ix_ledger_conversation_ts_cost" in names and "ix_ledger_conversation_ts" not in names
        assert "ix_ledger_ts_conversation_tenant" in names and "ix_ledger_ts_conversation" not in names  # v10
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'ledger_conversation_span'::regclass"
        ).fetchone()
        assert options == ["fillfactor=80"]


async def test_submitted_rows_are_durable_in_the_outbox_before_postgres(tmp_path: Path) -> None:
    # Nothing listens on port 1: PostgreSQL is "down"; the submit still commits (outbox).
    led = PostgresLedger("postgresql://postgres@127.0.0.1:1/x", tmp_path / "outbox.db", wait_timeout=2)
    led.start()
    try:
        assert await asyncio.wait_for(led.submit(make_row(1)), 5) is True
        assert led.healthy()  # the outbox works: the gateway is ready
        for _ in range(100):
            if led.ship_error is not None and led.outbox_rows() == 1:
                break
            await asyncio.sleep(0.05)
        assert led.ship_error is not None and led.outbox_rows() == 1
    finally:
        led.close(timeout=3)


def test_reports_agree_on_both_stores(pg_url: str, tmp_path: Path) -> None:
    sqlite_path = tmp_path / "ledger.db"
    fill_sqlite(sqlite_path)
    fill_postgres(pg_url, tmp_path).close()
    for url in (sqlite_path, pg_url):
        assert [ln.key for ln in spend(url, "model", None)] == ["gpt-4o", "gpt-4o-mini", "llama", "(cache)"]
    for group in ("model", "route", "tenant", "provider", "key", "cause", "none"):
        for bucket in ("hour", "day", "month", "none"):
            a = spend_series(sqlite_path, group, bucket, None)
            b = spend_series(pg_url, group, bucket, None)
            assert a == b, (group, bucket)
    now = T0 + 86_400 * 41
    for url in (sqlite_path, pg_url):
        assert savings_by_cause(url, "none", None) == savings_by_cause(sqlite_path, "none", None)
        assert spent_since(url, "tenant", T0 + 3600) == {"acme": D("0.26"), "beta": D("1.5")}
        assert spent_by(url, "key", "k2", T0) == D("1.5")
        assert spent_by(url, "route", "nope", T0) == D("0")
        recent = spend(url, "tenant", 86_400 * 2, now=now)
        assert {ln.key: ln.requests for ln in recent} == {"acme": 1, "beta": 1}
        assert spend(url, "model", None, until=T0 + 3600, tenant="acme")[0].requests == 1


def test_series_buckets_and_csv(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    fill_sqlite(path)
    hourly = spend_series(path, "model", "hour", None)
    assert [(r["bucket"], r["group"]) for r in hourly[:3]] == [
        ("2025-11-30T00:00:00Z", "gpt-4o-mini"),
        ("2025-11-30T01:00:00Z", "gpt-4o-mini"),
        ("2025-11-30T02:00:00Z", "(cache)"),
    ]
    monthly = {(r["bucket"], r["group"]): r for r in spend_series(path, "tenant", "month", None)}
    assert set(monthly) == {
        ("2025-11", "acme"),
        ("2025-12", "beta"),
        ("2026-01", "acme"),
        ("2026-01", "beta"),
    }
    assert monthly[("2025-11", "acme")]["cost_usd"] == "0.2500000001"
    assert monthly[("2025-11", "acme")]["savings_usd"] == "0.2510000002"
    causes = {r["cause"]: r["savings_usd"] for r in savings_by_cause(path, "none", None)}
    assert causes == {
        "routing": "0.2500000002",
        "exact_cache": "0.0010000000",
        "self_hosted": "0.1900000000",
        "none": "0.0000000000",
    }
    text = to_csv(spend_series(path, "model", "day", None, tenant="beta"))
    lines = text.splitlines()
    assert lines[0] == (
        "bucket,group,requests,errors,unpriced,input_tokens,cached_tokens,cached_share,output_tokens,"
        "cost_usd,baseline_cost_usd,savings_usd"
    )
    assert lines[1].startswith("2025-12-01,gpt-4o,1,0,0,") and lines[1].endswith(
        ",1.5000000000,1.5000000000,0.0000000000"
    )
    assert to_csv([]) == ""
    with pytest.raises(ValueError, match="bucket"):
        spend_series(path, "model", "week", None)
    with pytest.raises(ValueError, match="scope"):
        spent_since(path, "colour", 0)


def test_unreachable_postgres_report_is_a_clear_error() -> None:
    with pytest.raises(LedgerUnavailable, match="PostgreSQL"):
        spend("postgresql://postgres@127.0.0.1:1/x", "model", None)


def test_ledger_spent_since_counts_rows_still_in_the_outbox(pg_url: str, tmp_path: Path) -> None:
    fill_postgres(pg_url, tmp_path / "a").close()
    waiting = SQLiteLedger(tmp_path / "b" / "outbox.db")  # rows a shipper has not moved yet
    waiting.start()
    waiting.write(make_row(100, ts=T0 + 7200, tenant="beta", cost_usd=D("0.5")))
    waiting.close()
    led = PostgresLedger(pg_url, tmp_path / "b" / "outbox.db")  # not started: nothing ships
    assert led.spent_since("tenant", T0 + 3600) == {"acme": D("0.26"), "beta": D("2.0")}
    sqlite_only = SQLiteLedger(tmp_path / "b" / "outbox.db")
    assert sqlite_only.spent_since("tenant", T0) == {"beta": D("0.5")}


async def test_start_up_budget_seeding_counts_rows_still_in_the_outbox(pg_url: str, tmp_path: Path) -> None:
    """The budgets a gateway starts with include what its outbox has not shipped yet (the
    seeding once read PostgreSQL alone and forgot them)."""
    now = time.time()
    central = PostgresLedger(pg_url, tmp_path / "a" / "outbox.db", idle_interval=0.05)
    central.start()
    central.write(make_row(1, ts=now, tenant="beta", cost_usd=D("1.5")))
    assert central.ship_now(20), central.ship_error
    central.close()
    waiting = SQLiteLedger(tmp_path / "b" / "outbox.db")
    waiting.start()
    waiting.write(make_row(2, ts=now, tenant="beta", cost_usd=D("0.5")))
    waiting.close()
    ledger = PostgresLedger(pg_url, tmp_path / "b" / "outbox.db")  # not started: nothing ships
    policy = Policy.model_validate({"tenants": {"beta": {"budget": {"daily_usd": "10"}}}})
    limits = Limits(spawn=TaskOwner().spawn)
    await seed_budgets(limits, policy, ledger)
    (row,) = [r for r in await limits.status(policy) if r["scope"] == "tenant" and r["period"] == "day"]
    assert Decimal(row["spent_usd"]) == D("2.0")
