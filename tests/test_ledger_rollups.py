"""Rollups (schema v4): reports read from ``ledger_rollup_day``/``_hour`` plus the raw rows at
the window's edges equal the reports over the raw rows alone, to the 1e-10 USD, on SQLite and
PostgreSQL: every group, every bucket, windows cut at and between hour and day edges (rows a
float ulp either side of an edge included), replayed request ids, the back-fill of an older
ledger, and the rows still waiting in the PostgreSQL outbox."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.db import LedgerDb, Window, open_db
from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.query import grouped, plan, spent_by, spent_since
from gateway.ledger.report import GROUPS, spend, spend_series
from gateway.ledger.schema import (
    POSTGRES_MIGRATIONS,
    SCHEMA_VERSION,
    SQLITE_INSERT_SQL,
    SQLITE_MIGRATIONS,
    apply_migrations,
)
from gateway.ledger.sqlite import migrate, row_params
from gateway.ledger.store import SQLiteLedger
from tests.pg_support import scratch_schema
from tests.test_ledger_store import make_row

D = Decimal
HOUR, DAY = 3600.0, 86_400.0
T0 = 1_764_460_800.0  # 2025-11-30T00:00:00Z, a day edge
BUCKETS = ("hour", "day", "month", "none")


def sample_rows(n: int = 400, seed: int = 3) -> list[LedgerRow]:
    """Rows over three days from T0 - 1 day, a tenth of them on or a float ulp beside an hour
    or day edge; unknown costs, tokens and baselines, cache hits and errors mixed in."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        if i % 10 == 0:
            edge = T0 + rnd.randint(-24, 48) * HOUR
            ts = rnd.choice([edge, math.nextafter(edge, 0), math.nextafter(edge, math.inf)])
        else:
            ts = T0 - DAY + rnd.random() * 3 * DAY
        hit = rnd.random() < 0.1
        cost = None if rnd.random() < 0.05 else D(rnd.randint(0, 10**9)).scaleb(-10)
        out.append(
            make_row(
                i,
                ts=ts,
                tenant=rnd.choice(["acme", "beta", "gamma"]),
                key_id=rnd.choice(["k1", "k2", "k3", None]),
                route=rnd.choice(["auto", "smart", None]),
                served_model=None if hit else rnd.choice(["gpt-4o", "gpt-4o-mini", "llama", None]),
                provider=None if hit else rnd.choice(["openai", "engine"]),
                cache_status="hit" if hit else rnd.choice(["miss", "bypass"]),
                input_tokens=None if rnd.random() < 0.05 else rnd.randint(1, 5000),
                cached_tokens=rnd.choice([None, 0, rnd.randint(0, 1000)]),
                output_tokens=rnd.randint(0, 900),
                cost_usd=cost,
                baseline_cost_usd=None if rnd.random() < 0.2 else D(rnd.randint(0, 10**9)).scaleb(-10),
                status="ok" if rnd.random() < 0.9 else "error",
                savings_cause=rnd.choice(["routing", "exact_cache", "none"]),
                conversation=rnd.choice([None, "c0ffee0000000001", "c0ffee0000000002"]),
            )
        )
    return out


WINDOWS: list[tuple[float | None, float | None]] = [
    (None, None),
    (T0, None),
    (T0 - DAY + 1800.5, None),
    (None, T0 + DAY),
    (T0 - 0.25 * HOUR, T0 + DAY + 5 * HOUR + 17),
    (T0 + 3 * HOUR, T0 + 4 * HOUR),  # exactly one hour: that hour is whole
    (T0 + 3 * HOUR + 1, T0 + 4 * HOUR - 1),  # inside one hour: raw only
    (math.nextafter(T0 + HOUR, 0), math.nextafter(T0 + 2 * DAY, math.inf)),
    (T0 - DAY, T0 + 2 * DAY),
]


def _write_sqlite(path: Path, rows: list[LedgerRow]) -> None:
    led = SQLiteLedger(path, batch_size=64)
    led.start()
    for r in rows:
        led.write(r)
    led.close()


def _write_postgres(url: str, outbox: Path, rows: list[LedgerRow]) -> None:
    led = PostgresLedger(url, outbox, batch_size=64, ship_batch=100, idle_interval=0.05)
    led.start()
    try:
        for r in rows:
            led.write(r)
        assert led.ship_now(30), led.ship_error
    finally:
        led.close()


@pytest.fixture
def pg_url() -> Iterator[str]:
    with scratch_schema("sy_rollup") as url:
        yield url


def _truth(rows: list[LedgerRow], since: float | None, until: float | None) -> dict[str, Decimal]:
    """Cost per tenant from the rows themselves (Python Decimal sums, no SQL)."""
    out: dict[str, Decimal] = {}
    for r in rows:
        if (since is None or r.ts >= since) and (until is None or r.ts < until):
            out[r.tenant] = out.get(r.tenant, D(0)) + (r.cost_usd or 0)
    return out


def _spent_truth(rows: list[LedgerRow], scope: str, name: str, since: float) -> Decimal:
    """What ``spent_by`` must answer, from the rows themselves."""
    attr = {"key": "key_id", "tenant": "tenant", "route": "route"}[scope]
    return sum((r.cost_usd or D(0) for r in rows if r.ts >= since and getattr(r, attr) == name), D(0))


SPENDERS = (("key", "k1"), ("key", "k3"), ("tenant", "beta"), ("route", "smart"), ("route", "nope"))


def _same(db: LedgerDb, group: str, bucket: str, window: Window) -> bool:
    """``grouped`` from the rollups and edges equals ``grouped`` over the raw rows alone."""
    db.rollups = True
    fast = grouped(db, group, bucket, window)
    db.rollups = False
    slow = grouped(db, group, bucket, window)
    db.rollups = True

    def norm(g: dict[tuple[object, str | None], list[object]]) -> dict[object, list[object]]:
        return {k: [0 if v is None else v for v in sums] for k, sums in g.items()}

    return norm(fast) == norm(slow)


def _check_all(url: str | Path, rows: list[LedgerRow]) -> int:
    """Every window, group, bucket (and a tenant): rollups + edges == raw rows; the reports
    built on them agree too, and with the rows' own sums. Returns the comparisons made."""
    checked = 0
    with open_db(url) as db:
        assert db is not None and db.rollups
        for since, until in WINDOWS:
            for group in GROUPS:
                for bucket in BUCKETS:
                    assert _same(db, group, bucket, Window(since, until)), (since, until, group, bucket)
                    checked += 1
            assert _same(db, "model", "day", Window(since, until, "beta")), (since, until)
    for since, until in WINDOWS:
        now, seconds = (None, None) if since is None else (since, 0.0)  # since = now - 0 exactly
        kw = {"now": now, "until": until}
        fast = spend_series(url, "model", "day", seconds, **kw)  # type: ignore[arg-type]
        assert fast == spend_series(url, "model", "day", seconds, rollups=False, **kw)  # type: ignore[arg-type]
        by_tenant = {ln.key: ln.cost_usd for ln in spend(url, "tenant", seconds, now=now, until=until)}
        assert by_tenant == _truth(rows, since, until), (since, until)
        for scope, name in SPENDERS:  # from the rollups and the edge rows too
            got = spent_by(url, scope, name, since or 0.0)  # type: ignore[arg-type]
            assert got == _spent_truth(rows, scope, name, since or 0.0), (scope, name, since)
    return checked


def test_plan_splits_a_window_into_edges_and_whole_buckets() -> None:
    since, until = T0 - 0.25 * HOUR, T0 + DAY + 5 * HOUR + 17
    hour0 = int(T0 / HOUR)
    parts = plan(since, until)
    assert [p[0] for p in parts] == ["raw", "raw", "ledger_rollup_day", "ledger_rollup_hour"]
    assert parts[2][1:] == (hour0 // 24, hour0 // 24 + 1)  # the one whole day
    assert parts[3][1:] == (hour0 + 24, hour0 + 29)  # then five whole hours; T0 - 15 min is an edge
    assert [p[1].since for p in parts[:2]] == [since, T0 + DAY + 5 * HOUR - 1]  # edges narrowed
    assert [p[1].until for p in parts[:2]] == [T0 + 1, until]
    assert plan(T0 + 1, T0 + 2) == [("raw", Window(T0 + 1, T0 + 2), ("", ()))]
    assert [p[0] for p in plan(None, None)] == ["ledger_rollup_day"]
    assert [p[0] for p in plan(T0, T0 + 30 * DAY, hourly=True)] == ["raw", "raw", "ledger_rollup_hour"]


def test_sqlite_rollups_equal_the_raw_rows(tmp_path: Path) -> None:
    rows = sample_rows()
    path = tmp_path / "ledger.db"
    _write_sqlite(path, rows)
    assert _check_all(path, rows) > 200
    # the reports really read the rollups: a tampered cell shows (the raw rows do not change)
    with sqlite3.connect(path) as conn:
        assert (
            conn.execute("SELECT SUM(requests) FROM ledger_rollup_day WHERE dim = 'tenant'").fetchone()[0]
            == 400
        )
        conn.execute("UPDATE ledger_rollup_day SET cost = cost + 1 WHERE dim = 'tenant' AND tenant = 'acme'")
        cells = conn.execute(
            "UPDATE ledger_rollup_day SET cost = cost + 1 WHERE dim = 'key' AND value = '=k1'"
        )
    assert spend(path, "tenant", None) != spend(path, "tenant", None, rollups=False)
    assert spent_by(path, "key", "k1", 0.0) == _spent_truth(rows, "key", "k1", 0.0) + cells.rowcount * D(
        "1E-10"
    )
    assert spent_by(path, "key", "k3", 0.0) == _spent_truth(rows, "key", "k3", 0.0)


def test_postgres_rollups_equal_the_raw_rows(pg_url: str, tmp_path: Path) -> None:
    rows = sample_rows(seed=5)
    _write_postgres(pg_url, tmp_path / "outbox.db", rows)
    assert _check_all(pg_url, rows) > 200
    sqlite_path = tmp_path / "ledger.db"
    _write_sqlite(sqlite_path, rows)
    for group in ("model", "key", "none"):
        assert spend_series(pg_url, group, "day", None) == spend_series(sqlite_path, group, "day", None)
    with pg_connect(pg_url) as conn:
        conn.execute("UPDATE ledger_rollup_day SET cost = cost + 1 WHERE dim = 'tenant' AND tenant = 'acme'")
        cells = conn.execute(
            "UPDATE ledger_rollup_day SET cost = cost + 1 WHERE dim = 'route' AND value = '=smart'"
        )
    assert spend(pg_url, "tenant", None) != spend(pg_url, "tenant", None, rollups=False)
    assert (
        spent_by(pg_url, "route", "smart", 0.0) == _spent_truth(rows, "route", "smart", 0.0) + cells.rowcount
    )
    assert spent_by(pg_url, "route", "auto", 0.0) == _spent_truth(rows, "route", "auto", 0.0)


def test_replayed_request_ids_add_nothing(pg_url: str, tmp_path: Path) -> None:
    rows = sample_rows(120, seed=9)
    path = tmp_path / "ledger.db"
    _write_sqlite(path, rows + rows[:30])  # duplicates within a batch and across batches
    _write_sqlite(path, rows[50:])  # and again, later
    _write_postgres(pg_url, tmp_path / "outbox.db", rows + rows[:30])
    _write_postgres(pg_url, tmp_path / "outbox.db", rows[50:])  # the same ids shipped again
    for url in (path, pg_url):
        assert sum(ln.requests for ln in spend(url, "tenant", None)) == 120
        assert spend_series(url, "model", "hour", None) == spend_series(
            url, "model", "hour", None, rollups=False
        )
        assert {ln.key: ln.cost_usd for ln in spend(url, "tenant", None)} == _truth(rows, None, None)


def _old_sqlite(path: Path, version: int, rows: list[LedgerRow]) -> None:
    """A ledger file as schema ``version`` left it, holding ``rows``."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.create_function("sy_e10", 1, lambda v: None if v is None else int(D(v).scaleb(10)))
    apply_migrations(conn.execute, {v: SQLITE_MIGRATIONS[v] for v in range(1, version + 1)}, "?")
    n = 27 if version < 3 else 28  # the columns that version has (v3 added conversation)
    cols = SQLITE_INSERT_SQL.split("(", 1)[1].split(")", 1)[0].split(", ")
    keep = [*cols[:n], "cost_e10", "baseline_e10"]
    sql = f"INSERT INTO ledger ({', '.join(keep)}) VALUES ({', '.join('?' for _ in keep)})"
    for r in rows:
        p = row_params(r)
        conn.execute(sql, (*p[:n], *p[-2:]))
    conn.close()


def test_sqlite_migration_back_fills_the_rollups_and_keeps_old_rows(tmp_path: Path) -> None:
    rows = [r for r in sample_rows(200, seed=11)]
    old = [r for r in rows if r.conversation is None][:100]
    path = tmp_path / "ledger.db"
    _old_sqlite(path, 2, old)  # before conversations and rollups
    new = [make_row(1000 + i, ts=T0 + i * 977.0, conversation="feedfacefeedface") for i in range(40)]
    _write_sqlite(path, new)  # the writer migrates (v3, v4 with its back-fill), then writes
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT COUNT(*) FROM ledger WHERE conversation IS NULL").fetchone()[0] == len(
            old
        )
    assert _check_all(path, old + new) > 200
    (conv,) = spend(path, "conversation", None)
    assert conv.key == "feedfacefeedface" and conv.requests == 40


def test_postgres_migration_back_fills_the_rollups_and_keeps_old_rows(pg_url: str, tmp_path: Path) -> None:
    old = [r for r in sample_rows(150, seed=13) if r.conversation is None]
    with pg_connect(pg_url) as conn:
        with conn.cursor() as cur:
            apply_migrations(cur.execute, {1: POSTGRES_MIGRATIONS[1], 2: POSTGRES_MIGRATIONS[2]}, "%s")
            cols = SQLITE_INSERT_SQL.split("(", 1)[1].split(")", 1)[0].split(", ")[:27]
            sql = f"INSERT INTO ledger ({', '.join(cols)}) VALUES ({', '.join('%s' for _ in cols)})"
            for r in old:
                p = list(row_params(r)[:27])
                p[16:18] = [r.cost_usd, r.baseline_cost_usd]
                cur.execute(sql, p)
        conn.commit()
    new = [make_row(2000 + i, ts=T0 + i * 1601.0, conversation="feedfacefeedface") for i in range(30)]
    _write_postgres(pg_url, tmp_path / "outbox.db", new)  # the shipper migrates, then ships
    with pg_connect(pg_url) as conn:
        assert conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("SELECT COUNT(*) FROM ledger WHERE conversation IS NULL").fetchone() == (
            len(old),
        )
    assert _check_all(pg_url, old + new) > 200


def test_spent_since_counts_postgres_rollups_and_the_outbox(pg_url: str, tmp_path: Path) -> None:
    rows = sample_rows(300, seed=17)
    shipped, waiting = rows[:200], rows[200:]
    _write_postgres(pg_url, tmp_path / "a" / "outbox.db", shipped)
    outbox = tmp_path / "b" / "outbox.db"
    _write_sqlite(outbox, waiting)  # rows a shipper has not moved yet
    led = PostgresLedger(pg_url, outbox)  # not started: nothing ships
    for since in (T0 - DAY, math.nextafter(T0, 0), T0 + 5 * HOUR + 0.5, T0 + 2 * DAY - 1):
        want = {t: usd for t, usd in _truth(rows, since, None).items()}
        assert led.spent_since("tenant", since) == want, since
        assert spent_since(pg_url, "tenant", since) == _truth(shipped, since, None)
        by_key = spent_since(pg_url, "key", since)
        assert by_key == spent_since(pg_url, "key", since, rollups=False)
        assert None not in by_key and "" not in by_key


def test_outbox_keeps_no_rollups_of_its_own(tmp_path: Path) -> None:
    led = PostgresLedger("postgresql://postgres@127.0.0.1:1/x", tmp_path / "outbox.db")
    led.start()  # PostgreSQL is down: rows stay in the outbox
    try:
        led.write(make_row(1, ts=T0))
        assert led.flush(5)
    finally:
        led.close(timeout=1)
    conn = sqlite3.connect(tmp_path / "outbox.db")
    migrate(conn)
    assert conn.execute("SELECT COUNT(*) FROM ledger").fetchone() == (1,)
    assert conn.execute("SELECT COUNT(*) FROM ledger_rollup_hour").fetchone() == (0,)
    conn.close()
