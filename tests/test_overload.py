"""Load shedding: past server.max_in_flight the gateway refuses at once with an OpenAI-shaped
503 and Retry-After, keeps /healthz answering, loses no admitted request, recovers, and its
memory stays bounded across bursts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from gateway.config.loader import PolicyError, load_policy
from load_tests.mock_upstream import MockUpstream
from load_tests.scenarios.overload import run_overload
from tests.gateway_harness import mock_policy, start_gateway

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


def test_bursts_are_shed_fast_and_the_gateway_recovers(tmp_path: Path) -> None:
    r = run_overload(tmp_path, max_in_flight=16, clients=120, bursts=3, upstream_ms=400)
    for burst in r["bursts"]:
        assert burst["other"] == {}, burst  # only 200 or 503, never a 5xx of another kind
        assert burst["ok"] + burst["shed_503"] == 120
        assert 1 <= burst["ok"] <= 16, burst
        assert burst["shed_503"] >= 100
        assert burst["shed_with_retry_after"] == burst["shed_503"]
        # a refusal never waits for the slow upstream (400 ms): it is answered at once
        assert burst["shed_ms_max"] < 400, burst
        assert burst["healthz_probes"] >= 1 and burst["healthz_ms_max"] < 1000, burst
    assert r["recovery"]["ok"] == r["recovery"]["clients"] and r["recovery"]["shed_503"] == 0
    assert r["rows_lost"] == 0 and r["ledger_ok_rows"] == r["admitted"]
    # memory: after the first burst, later identical bursts add little (no per-request leak)
    first, *later = r["rss_after_bursts_kib"]
    assert max(later) - first < 8 * 1024, r["rss_after_bursts_kib"]


def test_refusal_shape_metric_and_exempt_paths(tmp_path: Path) -> None:
    with MockUpstream(ttft_ms=1500, itl_ms=0, tokens=4) as mock:
        extra = "server:\n  max_in_flight: 1\n  overload_retry_after_s: 7\n"
        gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra))
        try:
            gw.key()
            slow = threading.Thread(target=gw.post, args=("/v1/chat/completions", CHAT), daemon=True)
            slow.start()
            deadline = time.monotonic() + 5
            while not mock.requests() and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            r = gw.post("/v1/chat/completions", CHAT)
            assert time.perf_counter() - t0 < 0.5
            assert r.status_code == 503
            assert r.headers["retry-after"] == "7"
            assert r.json() == {
                "error": {
                    "message": "The gateway is at capacity; retry after the time in the Retry-After header",
                    "type": "server_error",
                    "param": None,
                    "code": "overloaded",
                }
            }
            # an Anthropic client gets Anthropic's shape
            m = gw.post(
                "/v1/messages",
                {"model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert m.status_code == 503 and m.headers["retry-after"] == "7"
            assert m.json() == {
                "type": "error",
                "error": {"type": "overloaded_error", "message": r.json()["error"]["message"]},
            }
            # probes and metrics are never shed
            assert gw.get("/healthz").status_code == 200
            assert gw.get("/readyz").status_code == 200
            metrics = gw.get("/metrics").text
            assert 'switchyard_load_shed_total{reason="in_flight"} 2.0' in metrics
            slow.join(10)
            ok = gw.post("/v1/chat/completions", CHAT)
            assert ok.status_code == 200
            assert [row["status"] for row in gw.ledger_rows()] == ["ok", "ok"]
        finally:
            gw.stop()


def test_unlimited_when_null(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, "server:\n  max_in_flight: null\n"))
    try:
        with httpx.Client(timeout=10) as c:
            r = c.post(gw.url + "/v1/chat/completions", json=CHAT, headers=gw.headers())
        assert r.status_code == 200
        assert gw.app_state.services.policy.server.max_in_flight is None
    finally:
        gw.stop()


@pytest.mark.parametrize("bad", ["max_in_flight: 0", "max_in_flight: -3", "overload_retry_after_s: 0"])
def test_bad_limits_are_policy_errors(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"server:\n  {bad}\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    assert any(p.startswith("server.") for p, _ in exc.value.problems)
