"""Every request visible: one INFO access-log line per request whatever its status (never a key
or a prompt; ``server.access_log: false`` turns it off), a Prometheus sample for every status
including 401 and 400, a ledger row with its error code for everything past authentication (a
body refused by validation included), and ``switchyard spend --by error`` naming the errors."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

PROMPT = "the secret plan is 42"


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


def _traffic(gw: RunningGateway) -> dict[str, int]:
    msgs = [{"role": "user", "content": PROMPT}]
    sent = {
        "ok": gw.post("/v1/chat/completions", {"model": "auto", "messages": msgs}).status_code,
        "unknown_model": gw.post("/v1/chat/completions", {"model": "nope", "messages": msgs}).status_code,
        "invalid": gw.post("/v1/chat/completions", {"model": "auto", "messages": "x"}).status_code,
        "not_json": gw.post("/v1/chat/completions", b"{not json").status_code,
        "messages_invalid": gw.post("/v1/messages", {"model": "claude", "messages": msgs}).status_code,
    }
    bad_key = {"authorization": "Bearer sk-sy-wrong-key-0123456789"}
    with_bad = gw.post("/v1/chat/completions", {"model": "auto", "messages": msgs}, headers=bad_key)
    sent["bad_key"] = with_bad.status_code
    return sent


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("access ")]


def test_every_request_leaves_a_line_a_sample_and_a_row(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="switchyard")
    sent = _traffic(gw)
    assert sent == {
        "ok": 200, "unknown_model": 404, "invalid": 400, "not_json": 400, "messages_invalid": 400, "bad_key": 401,
    }  # fmt: skip
    rows = gw.ledger_rows()
    lines = _access_lines(caplog)
    assert len(lines) == len(sent), lines  # one line each, the 401 included
    statuses = sorted(int(ln.split(" status=")[1].split()[0]) for ln in lines)
    assert statuses == sorted(sent.values())
    for line in lines:
        assert PROMPT not in line and "sk-sy-" not in line and gw.key() not in line, line
    (ok,) = [ln for ln in lines if " status=200 " in ln]
    assert " tenant=team-a endpoint=chat route=auto model=auto served=small " in ok and " error=- " in ok
    (unauth,) = [ln for ln in lines if " status=401 " in ln]
    assert " tenant=- endpoint=chat " in unauth and " error=invalid_api_key " in unauth
    # ledger: every request past authentication, with its error code; the 401 names no tenant
    got = sorted((r["endpoint"], r["http_status"], r["error_code"], r["requested_model"]) for r in rows)
    assert got == [
        ("chat", 200, None, "auto"),
        ("chat", 400, "invalid_request_error", ""),
        ("chat", 400, "invalid_request_error", "auto"),
        ("chat", 404, "model_not_found", "nope"),
        ("messages", 400, "invalid_request_error", "claude"),
    ]
    ids = {r["request_id"] for r in rows}
    assert all(any(f"access {i} " in ln for ln in lines) for i in ids)  # the row's id is the line's
    # metrics: a sample for every status
    metrics = gw.get("/metrics").text
    assert 'switchyard_rejections_total{code="invalid_api_key"} 1.0' in metrics
    assert 'switchyard_rejections_total{code="invalid_request_error"} 3.0' in metrics
    assert 'switchyard_rejections_total{code="model_not_found"} 1.0' in metrics
    errors = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith("switchyard_requests_total{") and 'status="error"' in ln
    ]
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in errors) == 5.0, errors


def test_the_access_log_can_be_turned_off(
    tmp_path: Path, mock: MockUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    policy = mock_policy(mock.base_url).replace(
        "\nproviders:", "\nserver:\n  access_log: false\nproviders:", 1
    )
    gateway = start_gateway(tmp_path, policy)
    try:
        caplog.set_level(logging.INFO, logger="switchyard")
        _traffic(gateway)
        assert _access_lines(caplog) == []
        assert len(gateway.ledger_rows()) == 5  # the rows and metrics stay
    finally:
        gateway.stop()


def test_spend_by_error_names_the_errors(gw: RunningGateway) -> None:
    _traffic(gw)
    gw.ledger_rows()  # flushed
    env = {
        **os.environ,
        "SWITCHYARD_HOME": str(gw.home),
        "SWITCHYARD_LEDGER": f"sqlite:///{gw.home / 'ledger.db'}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "spend", "--by", "error", "--csv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    groups = {line.split(",")[1]: line for line in proc.stdout.splitlines()[1:]}
    assert {"invalid_request_error", "model_not_found"} <= set(groups), proc.stdout


def test_one_line_per_request_on_every_protocol(gw: RunningGateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="switchyard")
    msgs = [{"role": "user", "content": PROMPT}]
    calls = [
        ("/v1/chat/completions", {"model": "auto", "messages": msgs, "stream": True}, "chat"),
        ("/v1/completions", {"model": "auto", "prompt": PROMPT}, "completions"),
        ("/v1/embeddings", {"model": "embed", "input": PROMPT}, "embeddings"),
        ("/v1/messages", {"model": "claude", "max_tokens": 16, "messages": msgs}, "messages"),
        ("/v1/responses", {"model": "auto", "input": PROMPT}, "responses"),
    ]
    for path, body, _ in calls:
        assert gw.post(path, body).status_code == 200, path
    lines = _access_lines(caplog)
    assert [ln.split(" endpoint=")[1].split()[0] for ln in lines] == [e for _, _, e in calls]
    assert all(" status=200 error=- " in ln and PROMPT not in ln for ln in lines), lines


def test_count_tokens_leaves_a_line_and_a_sample(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="switchyard")
    msgs = [{"role": "user", "content": PROMPT}]
    ok = gw.post("/v1/messages/count_tokens", {"model": "auto", "messages": msgs})
    assert ok.status_code == 200 and ok.headers["x-switchyard-token-count"] == "estimate"
    assert gw.post("/v1/messages/count_tokens", {"model": "nope", "messages": msgs}).status_code == 404
    lines = [ln for ln in _access_lines(caplog) if " endpoint=count_tokens " in ln]
    assert [ln.split(" status=")[1].split()[0] for ln in lines] == ["200", "404"], lines
    assert " route=auto " in lines[0] and " error=model_not_found " in lines[1]
    metrics = gw.get("/metrics").text
    assert 'endpoint="count_tokens",model="none",provider="none",route="auto",status="ok"} 1.0' in metrics
    assert 'switchyard_rejections_total{code="model_not_found"} 1.0' in metrics
    assert gw.ledger_rows() == []  # counting buys nothing: no ledger row


def test_models_calls_leave_a_line(gw: RunningGateway, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="switchyard")
    assert gw.get("/v1/models", headers=gw.headers()).status_code == 200
    assert gw.get("/v1/models/nope-1", headers=gw.headers()).status_code == 404
    lines = [ln for ln in _access_lines(caplog) if " endpoint=models " in ln]
    assert [ln.split(" status=")[1].split()[0] for ln in lines] == ["200", "404"], lines
    assert " model=nope-1 " in lines[1] and " error=model_not_found " in lines[1]


def test_requests_outside_the_flow_leave_a_line_and_a_sample_too(
    gw: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Stored responses, files, batches, feedback and admin calls are not metered requests (no
    ledger row) but still leave one access-log line and one metric sample each; a 401 there is
    logged once; health probes are not logged."""
    caplog.set_level(logging.INFO, logger="switchyard")
    auth = gw.headers()
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        statuses = [
            client.get("/v1/responses/resp_nope", headers=auth).status_code,
            client.get("/v1/files", headers=auth).status_code,
            client.get("/v1/batches", headers=auth).status_code,
            client.post(
                "/v1/feedback", json={"request_id": "req_nope", "score": 1}, headers=auth
            ).status_code,
            client.get(
                "/v1/files", headers={"authorization": "Bearer sk-sy-wrong-key-0123456789"}
            ).status_code,
            client.get("/healthz").status_code,
        ]
        metrics = client.get("/metrics").text
    assert statuses == [404, 200, 200, 404, 401, 200]
    lines = _access_lines(caplog)
    assert len(lines) == 5, lines  # the probe and the scrape leave none
    by_endpoint = sorted(
        (ln.split(" endpoint=")[1].split()[0], ln.split(" status=")[1].split()[0]) for ln in lines
    )
    assert by_endpoint == [
        ("batches", "200"), ("feedback", "404"), ("files", "200"), ("files", "401"), ("responses_store", "404"),
    ]  # fmt: skip
    assert all(" tenant=team-a " in ln for ln in lines if " status=401 " not in ln), lines
    samples = [ln for ln in metrics.splitlines() if ln.startswith("switchyard_requests_total{")]
    for endpoint in ("responses_store", "files", "batches", "feedback"):
        assert any(f'endpoint="{endpoint}"' in ln for ln in samples), (endpoint, samples)
