"""Deferred rollups (schema v6, SQLite): the writer commits rows alone and rolls them up a little
later (``rollup.roll``); until then every report reads the rows after the mark raw, so reports
are exact at every moment, a crash between the two leaves nothing out, and two writers on one
file never roll a row twice."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from gateway.core.ledger_row import LedgerRow
from gateway.ledger import rollup, store
from gateway.ledger.db import open_db
from gateway.ledger.schema import SQLITE_COLUMNS, SQLITE_INSERT_SQL, SQLITE_MIGRATIONS, apply_migrations
from gateway.ledger.sqlite import connect, immediate, migrate, row_params
from gateway.ledger.store import SQLiteLedger
from tests.test_ledger_rollups import _check_all, _write_sqlite, sample_rows


def _insert_raw(path: Path, rows: list[LedgerRow]) -> None:
    """Rows committed the way the writer commits them, with no roll after (a crash right
    after the commit, or a roll not due yet)."""
    conn = connect(path)
    with immediate(conn):
        conn.executemany(SQLITE_INSERT_SQL, [row_params(r) for r in rows])
    conn.close()


def _state(path: Path) -> tuple[int, int, list[tuple[object, ...]], list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        through = rollup.mark(conn)
        (top,) = conn.execute("SELECT COALESCE(MAX(id), 0) FROM ledger").fetchone()
        hour = conn.execute("SELECT * FROM ledger_rollup_hour ORDER BY 1, 2, 3, 4").fetchall()
        day = conn.execute("SELECT * FROM ledger_rollup_day ORDER BY 1, 2, 3, 4").fetchall()
    finally:
        conn.close()
    return through, top, hour, day


def _rebuilt(path: Path, tmp: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The rollups the v4 back-fill computes from the raw rows alone (the reference)."""
    ref = tmp / "ref.db"
    src = sqlite3.connect(path)
    dst = sqlite3.connect(ref)
    src.backup(dst)
    src.close()
    dst.execute("DELETE FROM ledger_rollup_hour")
    dst.execute("DELETE FROM ledger_rollup_day")
    dst.commit()
    dst.isolation_level = None
    dst.create_function("sy_e10", 1, lambda v: v, deterministic=True)
    for stmt in SQLITE_MIGRATIONS[4][2:]:  # the back-fill statements, after the two CREATEs
        dst.execute(stmt)
    hour = dst.execute("SELECT * FROM ledger_rollup_hour ORDER BY 1, 2, 3, 4").fetchall()
    day = dst.execute("SELECT * FROM ledger_rollup_day ORDER BY 1, 2, 3, 4").fetchall()
    dst.close()
    return hour, day


def test_reports_count_rows_not_yet_rolled_up_exactly_once(tmp_path: Path) -> None:
    rows = sample_rows(400, seed=5)
    path = tmp_path / "ledger.db"
    _write_sqlite(path, rows[:250])  # close() flushes: rolled up
    through, top, _, _ = _state(path)
    assert through == top == 250
    _insert_raw(path, rows[250:])  # committed, not rolled up
    through, top, _, _ = _state(path)
    assert (through, top) == (250, 400)
    assert _check_all(path, rows) > 200  # every window, group and bucket: exact
    led = SQLiteLedger(path)  # a writer starting on the file rolls the leftover rows up
    led.start()
    try:
        deadline = time.monotonic() + 5
        while _state(path)[0] < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        led.close()
    through, top, hour, day = _state(path)
    assert through == top == 400
    assert (hour, day) == _rebuilt(path, tmp_path)
    assert _check_all(path, rows) > 200


def test_the_writer_rolls_up_on_its_own_after_the_interval(tmp_path: Path) -> None:
    rows = sample_rows(40, seed=8)
    led = SQLiteLedger(tmp_path / "ledger.db")
    led.start()
    try:
        for r in rows:
            led.write(r)
        deadline = time.monotonic() + 5
        while _state(led.path)[0] < len(rows) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(led.path)[0] == len(rows)  # no flush(), no close(): the timer rolled
    finally:
        led.close()


def test_one_row_commits_touch_no_rollup_until_the_roll(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store, "ROLL_INTERVAL_S", 30.0)
    led = SQLiteLedger(tmp_path / "ledger.db", flush_interval=0)
    led.start()
    try:
        time.sleep(0.05)
        for r in sample_rows(20, seed=2):
            led.write(r)
        deadline = time.monotonic() + 5
        while _state(led.path)[1] < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        through, top, hour, _ = _state(led.path)
        assert (through, top, hour) == (0, 20, [])  # committed, not rolled (30 s interval)
        assert led.flush(5)  # flush() = committed and rolled up
        assert _state(led.path)[0] == 20
    finally:
        led.close()


def test_two_writers_on_one_file_never_roll_a_row_twice(tmp_path: Path) -> None:
    rows = sample_rows(600, seed=21)
    path = tmp_path / "ledger.db"
    a, b = SQLiteLedger(path, batch_size=16), SQLiteLedger(path, batch_size=16)
    a.start()
    b.start()
    try:
        for i, r in enumerate(rows):
            (a if i % 2 else b).write(r)
            if i % 97 == 0:
                (b if i % 2 else a).flush(5)  # rolls rows the other one committed too
    finally:
        a.close()
        b.close()
    through, top, hour, day = _state(path)
    assert through == top == len(rows)
    assert (hour, day) == _rebuilt(path, tmp_path)
    assert _check_all(path, rows) > 200


def test_v6_migration_marks_an_older_ledger_rolled_up(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.create_function("sy_e10", 1, lambda v: v, deterministic=True)
    apply_migrations(conn.execute, {v: s for v, s in SQLITE_MIGRATIONS.items() if v <= 5}, "?")
    rows = sample_rows(50, seed=4)
    params = [row_params(r) for r in rows]
    newer = {"batch_id", "compressed_tokens", "task"}  # v12's and v13's columns: a v5 table has none
    keep = [i for i, c in enumerate(SQLITE_COLUMNS) if c not in newer]
    v5_cols = [SQLITE_COLUMNS[i] for i in keep]
    conn.executemany(
        f"INSERT INTO ledger ({', '.join(v5_cols)}) VALUES ({', '.join('?' for _ in v5_cols)})",
        [tuple(p[i] for i in keep) for p in params],
    )
    for table, cells in rollup.cells(rollup.facts(params)).items():  # a v5 writer's rollups
        conn.executemany(rollup.SQLITE_UPSERT[table], rollup.params(cells))
    conn.close()
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn)
    assert rollup.mark(conn) == 50
    conn.close()
    with open_db(path) as db:
        assert db is not None and db.rolled_through == 50
    assert _check_all(path, rows) > 200
