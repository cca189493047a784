"""Graceful SIGTERM on a real `switchyard serve` process: in-flight streams finish within
--graceful-timeout, newcomers are refused at once, nothing is lost from the ledger; a stream
longer than the deadline is cut (never a clean [DONE]) and still recorded."""

from __future__ import annotations

import signal
from pathlib import Path

from load_tests.scenarios.drain import run_drain


def test_sigterm_drains_in_flight_streams(tmp_path: Path) -> None:
    r = run_drain(tmp_path, streams=3, tokens=20, itl_ms=100, graceful_s=10)
    assert r["completed_with_done"] == 3, r["texts"]
    assert r["late_requests_refused"] == 3 and r["late_requests_served"] == 0
    assert r["exit_code"] in (0, -signal.SIGTERM)
    assert r["exit_s"] < 10, "the drain waits for the streams, not for the whole deadline"
    assert r["exit_s"] >= 1.0, "SIGTERM must not cut streams that fit in the deadline"
    assert r["ledger_statuses"] == {"ok": 3} and r["rows_lost"] == 0
    assert not r["traceback_in_log"]


def test_streams_past_the_deadline_are_cut_not_completed(tmp_path: Path) -> None:
    r = run_drain(tmp_path, streams=2, tokens=100, itl_ms=100, graceful_s=1)
    assert r["completed_with_done"] == 0, "a cut stream must never end with [DONE]"
    for text in r["texts"]:
        assert "data: " in text and "[DONE]" not in text
    assert r["exit_s"] < 6, f"exit took {r['exit_s']} s with --graceful-timeout 1"
    assert r["exit_code"] in (0, -signal.SIGTERM)
    assert r["ledger_rows"] == 2 and r["rows_lost"] == 0, "cut streams still get their ledger rows"
    assert "ok" not in r["ledger_statuses"]


def test_shutdown_closes_providers_retired_by_a_reload(tmp_path: Path) -> None:
    """A reload retires the old provider clients for a grace period; a shutdown inside that
    period must still close them (no unclosed connections, no warnings at exit)."""
    import gc

    from load_tests.mock_upstream import MockUpstream
    from tests.gateway_harness import ADMIN_KEY, mock_policy, start_gateway

    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=4) as mock:
        gw = start_gateway(tmp_path, mock_policy(mock.base_url))
        try:
            chat = {"model": "auto", "messages": [{"role": "user", "content": "x"}]}
            assert gw.post("/v1/chat/completions", chat).status_code == 200  # opens a pooled connection
            old = gw.app_state.services.providers["mock"]
            gw.write_policy(mock_policy(mock.base_url).replace("sk-upstream-canary", "sk-upstream-rotated"))
            r = gw.post("/admin/policy/reload", tenant="x", headers={"authorization": f"Bearer {ADMIN_KEY}"})
            assert r.status_code == 200
            assert gw.app_state.services.providers["mock"] is not old
        finally:
            gw.stop()
        assert old._pool._pool is None, "the retired provider was left open"
        gc.collect()
