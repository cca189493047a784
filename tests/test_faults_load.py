"""The RESULTS.md scenarios in small form, through a real `switchyard serve` process: a random
fault mix under load, Redis hung/killed/restarted under load, and a corrupted-policy reload
storm under load. Zero failed requests, zero lost ledger rows, never a dirty stream."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from load_tests.scenarios.deps import run_redis_outage, run_reload_storm
from load_tests.scenarios.faults import run_fault_mix
from tests.conftest import service_unavailable


def test_fault_mix_under_load(tmp_path: Path) -> None:
    r = run_fault_mix(tmp_path, rps=20, seconds=6, fault_rate=0.3)
    assert r["bad"] == 0 and r["dirty_stream"] == 0, r["bad_examples"]
    assert r["faults_injected"] >= 10 and r["faults_hit"] == r["faults_injected"]
    assert r["ok"] + r["clean_error"] + r["broken_stream_flagged"] == r["requests"] == 120
    assert r["rows_lost"] == 0 and r["ledger_rows"] == r["requests"]
    assert r["ledger_statuses"].get("ok", 0) == r["ok"]
    assert r["gateway_alive"]


@pytest.mark.redis
def test_redis_outage_under_load(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server (binary)", "not on PATH")
    r = run_redis_outage(tmp_path, rps=20, seconds=8)
    assert r["bad"] == 0 and r["clean_error"] == 0, r["bad_examples"]
    assert r["ok"] == r["requests"] == 160
    assert r["faults_injected"] == 4
    assert r["rows_lost"] == 0


def test_reload_storm_under_load(tmp_path: Path) -> None:
    r = run_reload_storm(tmp_path, rps=20, seconds=4)
    assert r["bad"] == 0 and r["clean_error"] == 0, r["bad_examples"]
    assert r["ok"] == r["requests"]
    assert r["reloads"].get("error", 0) >= 10 and r["reloads"].get("ok", 0) >= 1
    assert r["rows_lost"] == 0
