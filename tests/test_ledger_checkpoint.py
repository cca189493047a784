"""The SQLite ledger checkpoints its WAL off the commit path (gateway/ledger/checkpoint.py):
no commit a request waits for runs SQLite's automatic checkpoint, the WAL stays bounded under
steady single-row commits, and a reader holding an old snapshot never stalls the writer."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger import checkpoint
from gateway.ledger.store import SQLiteLedger
from tests.test_ledger_store import make_row


def _row(i: int) -> LedgerRow:
    return make_row(i, request_id=f"ck-{i}", ts=time.time())


async def _one_by_one(ledger: SQLiteLedger, first: int, n: int, pause: float = 0.0) -> None:
    """Each row its own commit, as paced requests make them."""
    for i in range(first, first + n):
        assert await ledger.submit(_row(i))
        if pause:
            await asyncio.sleep(pause)


def _count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0])


def test_commits_do_not_checkpoint(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "l.db")
    ledger.start()
    try:
        assert ledger._conn is not None
        pages = ledger._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert pages == checkpoint.SAFETY_NET_PAGES  # SQLite's default (1000) checkpoints in commits
    finally:
        ledger.close()
    inline = SQLiteLedger(tmp_path / "inline.db", background_checkpoints=False)
    inline.start()
    try:
        assert inline._conn is not None
        assert inline._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        assert inline._checkpointer is None
    finally:
        inline.close()


def test_wal_stays_bounded_under_single_row_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint, "RESTART_FRAMES", 400)  # ~1.6 MB: reached within the test
    path = tmp_path / "l.db"
    ledger = SQLiteLedger(path)
    ledger.start()
    try:
        asyncio.run(_one_by_one(ledger, 0, 1500, pause=0.001))  # ~1,000 commits/s for ~1.5 s
        ck = ledger._checkpointer
        assert ck is not None
        deadline = time.monotonic() + 5
        while ck.rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ck.rounds > 0 and ck.caught_up > 0 and ck.errors == 0
        wal = path.with_name("l.db-wal").stat().st_size
        # each single-row commit appends ~10 pages: 1500 of them ~60 MB if it never started over
        assert wal < 12 * 1024 * 1024, wal
    finally:
        ledger.close()
    assert _count(path) == 1500


def test_a_reader_holding_a_snapshot_never_stalls_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "RESTART_FRAMES", 50)  # a RESTART is tried every round
    path = tmp_path / "l.db"
    ledger = SQLiteLedger(path)
    ledger.start()
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        asyncio.run(_one_by_one(ledger, 0, 50))
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == 50  # snapshot held
        started = time.monotonic()
        asyncio.run(_one_by_one(ledger, 50, 400))
        time.sleep(0.5)  # several checkpoint rounds, each finding the reader in the way
        asyncio.run(_one_by_one(ledger, 450, 50))
        held = time.monotonic() - started
        assert held < 5.0, held  # a RESTART waiting on the reader would hold writers for seconds
        reader.execute("COMMIT")
    finally:
        reader.close()
        ledger.close()
    assert _count(path) == 500
