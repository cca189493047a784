"""SIGKILL under load loses no ledger row of a request whose client got a complete response."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

from load_tests.mock_upstream import MockUpstream
from tests.durability_load import Load, gateway_process


def test_sigkill_under_load_keeps_every_completed_request(tmp_path: Path, mock: MockUpstream) -> None:
    home = tmp_path / "home"
    port = int(mock.base_url.rsplit(":", 1)[1])
    with gateway_process(home, port) as (gw, key):
        load = Load(gw.url, key, threads=8).start()
        try:
            load.wait_for(300, timeout=60)  # in full swing
            os.kill(gw.proc.pid, signal.SIGKILL)  # no shutdown hook, no flush
            gw.proc.wait(10)
        finally:
            load.stop()
    completed = set(load.completed)
    assert len(completed) == len(load.completed) >= 300
    conn = sqlite3.connect(home / "ledger.db")
    try:
        stored = {r[0]: r[1:] for r in conn.execute("SELECT request_id, status, cache_status FROM ledger")}
    finally:
        conn.close()
    missing = completed - set(stored)
    assert not missing, f"{len(missing)} of {len(completed)} completed requests have no ledger row"
    assert all(stored[rid][0] == "ok" for rid in completed)
    assert {stored[rid][1] for rid in completed} >= {"hit", "off"}  # both paths were exercised
    print(f"\n{len(completed)} complete responses before SIGKILL, all in the ledger ({len(stored)} rows)")
