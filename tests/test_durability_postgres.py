"""PostgreSQL goes away under load: requests keep succeeding, their rows wait in the local
outbox (``switchyard_ledger_outbox_rows`` > 0), and when PostgreSQL is back every row arrives,
none twice."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from gateway.ledger.pg import pg_connect
from load_tests.mock_upstream import MockUpstream
from tests.durability_load import Load, gateway_process
from tests.pg_outage import CuttableProxy, PrivateCluster
from tests.pg_support import scratch_schema

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
SHARED = ("127.0.0.1", 5432)


@pytest.fixture
def database() -> Iterator[PrivateCluster | CuttableProxy]:
    if os.environ.get("SWITCHYARD_TEST_PG_OUTAGE") == "proxy":  # exercise the fallback on purpose
        yield from _proxied()
        return
    cluster = PrivateCluster()
    try:
        cluster.init()
        cluster.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        cluster.destroy()
        print(f"\nno private PostgreSQL cluster here ({exc}); using a cuttable TCP proxy")
        yield from _proxied()
        return
    try:
        yield cluster
    finally:
        cluster.destroy()


def _proxied() -> Iterator[CuttableProxy]:
    base = f"postgresql://postgres@{SHARED[0]}:{SHARED[1]}/test"
    with scratch_schema("sy_outage", base) as url:
        proxy = CuttableProxy(SHARED, url)
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.destroy()


def outbox_rows(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("switchyard_ledger_outbox_rows "):
            return float(line.split()[1])
    raise AssertionError("switchyard_ledger_outbox_rows is not exported")


def wait_until(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def stored(url: str) -> tuple[set[str], int]:
    try:
        with pg_connect(url) as conn:
            ids = [r[0] for r in conn.execute("SELECT request_id FROM ledger")]
    except Exception:
        return set(), 0
    return set(ids), len(ids)


def test_postgres_outage_under_load(
    tmp_path: Path, mock: MockUpstream, database: PrivateCluster | CuttableProxy
) -> None:
    print(f"\nPostgreSQL outage simulated with: {database.kind}")
    port = int(mock.base_url.rsplit(":", 1)[1])
    env = {"SWITCHYARD_LEDGER": database.url}
    with gateway_process(tmp_path / "home", port, env) as (gw, key):
        load = Load(gw.url, key, threads=6).start()
        try:
            load.wait_for(150, timeout=60)
            wait_until(lambda: stored(database.url)[1] > 0, 30, "rows in PostgreSQL while it is up")
            database.crash()
            down_from = load.count()
            load.wait_for(down_from + 300, timeout=60)  # requests still succeed
            wait_until(lambda: outbox_rows(gw.url) > 0, 15, "rows waiting in the outbox")
            waiting = outbox_rows(gw.url)
            assert stored(database.url) == (set(), 0)  # really down
            database.start()
            load.wait_for(load.count() + 100, timeout=60)
        finally:
            load.stop()
        assert load.failed == [], load.failed[:5]
        completed = set(load.completed)
        wait_until(lambda: completed <= stored(database.url)[0], 60, "every row shipped after the outage")
        wait_until(lambda: outbox_rows(gw.url) == 0, 30, "an empty outbox")
    ids, total = stored(database.url)
    assert total == len(ids), f"{total - len(ids)} rows arrived twice"
    assert completed <= ids
    print(f"{len(completed)} complete responses, {load.count() - down_from} during/after the outage; "
          f"outbox peaked at >= {waiting:.0f} rows; all in PostgreSQL once")  # fmt: skip
