"""Report connections to the PostgreSQL ledger are reused (``pg.ReportConnections``): a second
report opens no new connection, a terminated backend is replaced once and the report still
answers, concurrent reports each get their own connection, a failed report leaves a usable
one, the idle pool stays bounded, and a report is one snapshot (rows committed while it runs are
not half in it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.ledger.db import LedgerUnavailable, open_db
from gateway.ledger.pg import REPORT_CONNECTIONS, ReportConnections, pg_connect
from gateway.ledger.postgres import ship_rows
from gateway.ledger.report import spend
from gateway.ledger.sqlite import row_params
from tests.pg_support import PG, scratch_schema
from tests.test_ledger_postgres import fill_postgres
from tests.test_ledger_store import make_row

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with scratch_schema("sy_pgrep") as url:
        fill_postgres(url, tmp_path).close()
        yield url


def _backend_pid(url: str) -> int:
    """The backend of the idle report connection for ``url`` (taken and given back)."""
    conn, reused = REPORT_CONNECTIONS.take(url)
    assert reused
    pid = conn.info.backend_pid
    REPORT_CONNECTIONS.give(url, conn)
    return pid


def test_a_second_report_reuses_the_connection(pg_url: str) -> None:
    first = spend(pg_url, "model", None)
    before = REPORT_CONNECTIONS.connects
    pid = _backend_pid(pg_url)
    for _ in range(5):
        assert spend(pg_url, "model", None) == first
    assert REPORT_CONNECTIONS.connects == before
    assert _backend_pid(pg_url) == pid


def test_a_terminated_backend_is_replaced_and_the_report_answers(pg_url: str) -> None:
    first = spend(pg_url, "tenant", None)
    pid = _backend_pid(pg_url)
    with pg_connect(PG) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    before = REPORT_CONNECTIONS.connects
    assert spend(pg_url, "tenant", None) == first
    assert REPORT_CONNECTIONS.connects == before + 1
    assert _backend_pid(pg_url) != pid


def test_a_failed_report_leaves_a_usable_connection(pg_url: str) -> None:
    with pytest.raises(Exception, match="division by zero"), open_db(pg_url) as db:
        assert db is not None
        db.rows("SELECT 1 / 0")
    before = REPORT_CONNECTIONS.connects
    assert [ln.key for ln in spend(pg_url, "tenant", None)] == ["beta", "acme"]
    assert REPORT_CONNECTIONS.connects == before  # rolled back and reused


def test_a_report_reads_one_snapshot(pg_url: str) -> None:
    with open_db(pg_url) as db:
        assert db is not None
        before = db.rows("SELECT COUNT(*), SUM(cost_usd) FROM ledger")
        with pg_connect(pg_url) as other, other.cursor() as cur:  # a row committed while it runs
            assert ship_rows(cur, [row_params(make_row(99, cost_usd=Decimal("5")))]) == 1
        assert db.rows("SELECT COUNT(*), SUM(cost_usd) FROM ledger") == before
        with pytest.raises(Exception, match="read-only"):
            db.rows("DELETE FROM ledger")
    with open_db(pg_url) as db:  # the next report sees it
        assert db is not None
        assert db.rows("SELECT COUNT(*) FROM ledger")[0][0] == before[0][0] + 1


def test_concurrent_reports_get_their_own_connections(pg_url: str) -> None:
    want = spend(pg_url, "key", None)
    got: list[object] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def report() -> None:
        try:
            start.wait()
            for _ in range(5):
                got.append(spend(pg_url, "key", None))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=report) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and got == [want] * 30


def test_the_idle_pool_is_bounded_and_a_down_server_is_unavailable(pg_url: str) -> None:
    pool = ReportConnections(idle_max=2)
    conns = [pool.take(pg_url)[0] for _ in range(4)]
    assert pool.connects == 4
    for c in conns:
        pool.give(pg_url, c)
    assert sum(c.closed for c in conns) == 2  # the two oldest were closed
    again = [pool.take(pg_url) for _ in range(3)]
    assert [reused for _, reused in again] == [True, True, False]
    for c, _ in again:
        c.close()
    pool.close_all()
    with pytest.raises(LedgerUnavailable), open_db("postgresql://postgres@127.0.0.1:1/test"):
        pass
