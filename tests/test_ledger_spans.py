"""Conversation spans (schema v8, opt-in): the top N conversations from the spans equal the plain
ranking's SQL over the raw rows, on SQLite (rows not rolled up yet included) and PostgreSQL, for
windows cut anywhere inside a span and across span starts; ties, unpriced rows, refunds and
zero costs included. Turning them on back-fills exactly what the writers would have kept;
a writer running without them marks them stale, and reports fall back."""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger import spans
from gateway.ledger.conversations import from_spans, plain
from gateway.ledger.db import Window, open_db
from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.report import spend
from gateway.ledger.schema import SQLITE_INSERT_SQL
from gateway.ledger.sqlite import connect, immediate, row_params
from gateway.ledger.store import SQLiteLedger
from tests.pg_support import scratch_schema
from tests.test_ledger_store import make_row

D = Decimal
DAY = 86_400.0
T0 = 32 * 640 * DAY  # a span start (day 20,480: 2026-01-27)
CONVS = [f"c0ffee{i:010x}" for i in range(300)]


def sample(n: int = 6000, seed: int = 9, days: float = 80.0) -> list[LedgerRow]:
    """Rows over ``days`` from T0 - 8 days: costs drawn from a few values (ties), some unpriced,
    some zero, a few refunds (negative), one conversation with only unpriced rows."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        conv = rnd.choice([*CONVS[:-1], None])
        cost: Decimal | None = D(rnd.choice([1, 2, 3, 5, 8, 13])).scaleb(-6)
        roll = rnd.random()
        if roll < 0.05:
            cost = None
        elif roll < 0.08:
            cost = D(0)
        elif roll < 0.10:
            cost = -D(rnd.randint(1, 5)).scaleb(-6)
        out.append(make_row(i, ts=T0 - 8 * DAY + rnd.random() * days * DAY, conversation=conv, cost_usd=cost))
    out.append(make_row(n, ts=T0 + 3.5 * DAY, conversation=CONVS[-1], cost_usd=None))
    return out


WINDOWS: list[tuple[float, float | None]] = [
    (T0, T0 + 30 * DAY),
    (T0 + 0.3 * DAY, T0 + 30.7 * DAY),
    (T0 - 7.5 * DAY, T0 + 20 * DAY),  # begins in the span before
    (T0 + 10 * DAY, T0 + 12 * DAY),
    (T0 + 31.5 * DAY, T0 + 33.25 * DAY),  # across a span start
    (T0 + 2 * DAY, T0 + 2.5 * DAY),  # under two days: the plain ranking
    (T0 + 3.9 * DAY, T0 + 6.2 * DAY),  # short: tight bounds first (each edge's part inside added)
    (T0 + 5.1 * DAY, T0 + 9.95 * DAY),  # ... each edge's part outside subtracted
    (T0 + 12.6 * DAY, T0 + 27.3 * DAY),
    (T0 + 40 * DAY, T0 + 70 * DAY),
    (T0, T0 + 45 * DAY),  # longer than a span step: the plain ranking
    (T0 + 50 * DAY, None),  # up to now (the latest row)
]


def _check(url: str | Path, expect_spans: bool = True) -> int:
    """conversations.from_spans == the plain ranking for every window and N; returns how many the spans
    answered (the rest fell back)."""
    answered = 0
    with open_db(url) as db:
        assert db is not None and db.spans is expect_spans
        for since, until in WINDOWS:
            where, params = Window(since, until).where()
            where += " AND conversation IS NOT NULL"
            for n in (1, 3, 7, 20, 45):
                want = plain(db, where, params, n)
                got = from_spans(db, since, until, n)
                if got is not None:
                    answered += 1
                    assert got == want, (since, until, n)
        # the report itself (top N by the spans, then summed by bucket) equals the raw one
        for since, until in [*WINDOWS[:3], WINDOWS[-1]]:
            fast = spend(url, "conversation", 0.0, now=since, until=until, top=5)
            slow = spend(url, "conversation", 0.0, now=since, until=until, top=5, rollups=False)
            assert fast == slow
    return answered


def _write(path: Path, rows: list[LedgerRow], *, keep: bool) -> None:
    led = SQLiteLedger(path, batch_size=64, conversation_spans=keep)
    led.start()
    for r in rows:
        led.write(r)
    led.close()


def _span_rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT * FROM {spans.SPAN_TABLE} ORDER BY span, conversation").fetchall()
    finally:
        conn.close()


def test_cells_keep_running_positive_sums_in_both_spans() -> None:
    day = 32 * 7 + 5  # day 5 of span 7, day 37 of span 6
    found = spans.cells([(day * DAY + 10, "a", 30), (day * DAY + 99, "a", -7), ((day + 2) * DAY, "a", 4)])
    assert sorted(found) == [(6, "a"), (7, "a")]
    assert found[(7, "a")][:8] == [0, 0, 0, 0, 0, 30, 30, 34] and found[(7, "a")][63] == 34
    assert found[(6, "a")][36] == 0 and found[(6, "a")][37] == 30 and found[(6, "a")][39] == 34
    assert spans.cells([(5.0, None, 10)]) == {}
    for d in (0, 1, 20_480, 20_782, 29_999):  # a day's rows are one plain ts range
        start = spans.day_start(d)
        assert spans.day_of(start) == d and (
            d == 0 or spans.day_of(math.nextafter(start, -math.inf)) == d - 1
        )


def test_sqlite_top_conversations_from_the_spans_equal_the_ranking(tmp_path: Path) -> None:
    rows = sample()
    path = tmp_path / "ledger.db"
    _write(path, rows[:5000], keep=True)
    conn = connect(path)  # rows committed and not rolled up yet: read raw by conversations.from_spans
    with immediate(conn):
        conn.executemany(SQLITE_INSERT_SQL, [row_params(r) for r in rows[5000:]])
    conn.close()
    assert _check(path) >= 25


def test_turning_spans_on_back_fills_what_the_writer_would_keep(tmp_path: Path) -> None:
    rows = sample(seed=4)
    kept, later = tmp_path / "kept.db", tmp_path / "later.db"
    _write(kept, rows, keep=True)
    _write(later, rows, keep=False)
    with open_db(later) as db:
        assert db is not None and not db.spans
        assert from_spans(db, *WINDOWS[0], 5) is None  # not kept: the plain ranking answers
    assert _span_rows(later) == []
    _write(later, [], keep=True)  # start-up with spans on: the back-fill
    assert _span_rows(later) == _span_rows(kept)
    assert _check(later) >= 25
    _write(later, [make_row(9999, ts=T0 + DAY, conversation=CONVS[0])], keep=False)
    with open_db(later) as db:  # a writer without spans: stale, never trusted
        assert db is not None and not db.spans
    assert _check(later, expect_spans=False) == 0


@pytest.fixture
def pg_url() -> Iterator[str]:
    with scratch_schema("sy_spans") as url:
        yield url


def test_postgres_top_conversations_from_the_spans(pg_url: str, tmp_path: Path) -> None:
    rows = sample(seed=12)
    first = PostgresLedger(pg_url, tmp_path / "a.db", batch_size=64, ship_batch=100, idle_interval=0.05)
    first.start()  # without spans: shipped, spans stale
    try:
        for r in rows[:3000]:
            first.write(r)
        assert first.ship_now(30), first.ship_error
    finally:
        first.close()
    second = PostgresLedger(
        pg_url, tmp_path / "b.db", batch_size=64, ship_batch=100, idle_interval=0.05, conversation_spans=True
    )
    second.start()  # with spans: back-filled from the 3000, the rest kept as shipped
    try:
        for r in rows[3000:]:
            second.write(r)
        assert second.ship_now(30), second.ship_error
    finally:
        second.close()
    assert _check(pg_url) >= 25
    sqlite_path = tmp_path / "ledger.db"
    _write(sqlite_path, rows, keep=True)
    with pg_connect(pg_url) as conn:
        pg_rows = conn.execute(f"SELECT * FROM {spans.SPAN_TABLE} ORDER BY span, conversation").fetchall()
    assert [tuple(r) for r in pg_rows] == _span_rows(sqlite_path)  # the same sums on both stores


def test_a_tie_at_the_bound_is_settled_by_name_as_the_ranking_does(tmp_path: Path) -> None:
    """64 conversations whose bound (8: a row earlier on the window's first day) is above
    what they spent in the window (5), and 20 whose bound is exact (5): the 65th bound equals
    the best sum, so nothing is settled until every tied conversation is summed; the ranking
    puts the first name, 'a00', first."""
    since = T0 + 4.5 * DAY
    rows = []
    for i in range(64):
        rows.append(make_row(i, ts=since - 0.2 * DAY, conversation=f"b{i:02d}", cost_usd=D("0.000003")))
        rows.append(make_row(100 + i, ts=since + DAY, conversation=f"b{i:02d}", cost_usd=D("0.000005")))
    for i, name in enumerate([*(f"a{j:02d}" for j in range(10)), *(f"c{j:02d}" for j in range(10))]):
        rows.append(make_row(200 + i, ts=since + 2 * DAY, conversation=name, cost_usd=D("0.000005")))
    path = tmp_path / "ledger.db"
    _write(path, rows, keep=True)
    with open_db(path) as db:
        assert db is not None and db.spans
        assert from_spans(db, since, since + 10 * DAY, 1) == ["a00"]
        assert from_spans(db, since, since + 10 * DAY, 3) == ["a00", "a01", "a02"]


def test_short_windows_cut_the_edge_days_and_settle_ties_by_name(tmp_path: Path) -> None:
    """A three-day window whose first day holds 70 conversations' earlier rows (outside it) and
    whose last day holds later ones: the tight bounds subtract those, so 100 conversations tied
    at the same spend inside are all summed (the 65th bound equals the best sum) and the
    ranking's name order decides; rows not rolled up yet stay candidates, and are never
    subtracted (they are not in the spans)."""
    since = T0 + 6.25 * DAY  # a quarter into its day: the part outside is the smaller one
    until = since + 3 * DAY  # a quarter into its day: the part inside is the smaller one
    later = T0 + 9.8 * DAY  # a second window ending late in its day (the part outside subtracted)
    rows = []
    for i in range(100):
        name = f"t{99 - i:02d}"
        rows.append(make_row(i, ts=since + DAY, conversation=name, cost_usd=D("0.000004")))
        if i < 70:
            rows.append(make_row(100 + i, ts=since - 0.1 * DAY, conversation=name, cost_usd=D("0.000009")))
            rows.append(make_row(200 + i, ts=until + 0.1 * DAY, conversation=name, cost_usd=D("0.000009")))
    rows.append(make_row(997, ts=until - 0.02 * DAY, conversation="s00", cost_usd=D("0.000006")))
    rows.append(make_row(996, ts=later - 0.01 * DAY, conversation="s01", cost_usd=D("0.00002")))
    path = tmp_path / "ledger.db"
    _write(path, rows, keep=True)
    late = [  # not rolled up: in the window (t99 a candidate), outside it (never subtracted)
        make_row(999, ts=since + 2 * DAY, conversation="t99", cost_usd=D("0.000001")),
        make_row(998, ts=since - 0.05 * DAY, conversation="t00", cost_usd=D("0.00005")),
    ]
    conn = connect(path)
    with immediate(conn):
        conn.executemany(SQLITE_INSERT_SQL, [row_params(r) for r in late])
    conn.close()
    with open_db(path) as db:
        assert db is not None and db.spans and db.rolled_through is not None
        for end in (until, later):
            where, params = Window(since, end).where()
            for n in (1, 3, 20, 40, 99):
                want = plain(db, where + " AND conversation IS NOT NULL", params, n)
                assert from_spans(db, since, end, n) == want, (end, n)
            if end == until:  # s00: one row just before the end; t99: the late row
                assert want[:4] == ["s00", "t99", "t00", "t01"]
        assert want[:2] == ["s01", "t99"]
