"""A request that fails on the server's side (5xx) leaves a WARNING line, one per kind of
failure every ten seconds at most, with the count of those held back; client errors and the
answers that went well leave none, and no line carries a message or a key."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.core.types import Principal, Target
from gateway.flow import metering
from gateway.flow.error_log import ErrorLog
from gateway.flow.exchange import Exchange
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def failed(status: int, code: str | None, state: str = "error", target: Target | None = None) -> Exchange:
    ex = Exchange("req-1", Principal("team-a", "k1", None), 0.0, 0.0)
    ex.http_status, ex.error_code, ex.status, ex.target = status, code, state, target
    return ex


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING, logger="switchyard")
    yield caplog


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "switchyard"]


def test_one_line_per_kind_per_interval_with_the_count_held_back(logs: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    errors = ErrorLog(interval_s=10.0, clock=clock)
    for _ in range(3):
        errors.note(failed(502, "upstream_error"))
    errors.note(failed(500, "provider_not_configured"))  # another kind: its own line
    assert len(lines(logs)) == 2
    assert lines(logs)[0] == "request req-1 failed: 502 upstream_error (error) on route -, no upstream called"
    clock.now += 10.0
    errors.note(failed(502, "upstream_error"))
    assert lines(logs)[-1].endswith("; 2 more like it since the last such line")
    clock.now += 10.0
    errors.note(failed(502, "upstream_error"))
    assert not lines(logs)[-1].endswith("since the last such line")  # none held back this time
    assert len(lines(logs)) == 4


def test_client_errors_and_disconnects_leave_no_line(logs: pytest.LogCaptureFixture) -> None:
    errors = ErrorLog()
    for status, code, state in ((400, "invalid_request", "error"), (429, "rate_limited", "error"),
                                (499, None, "client_disconnected"), (200, None, "ok")):  # fmt: skip
        errors.note(failed(status, code, state))
    assert lines(logs) == []


@pytest.fixture
def keyless(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    text = mock_policy(mock.base_url).replace(
        "providers:\n",
        "providers:\n  keyless:\n    type: openai\n    base_url: http://127.0.0.1:9/v1\n"
        "    api_key: ${KEYLESS_LOG_TEST_KEY:-}\n",
        1,
    )
    text = text.replace(
        "models:\n", "models:\n  orphan: {provider: keyless, upstream: x, price: {input: 1, output: 1}}\n", 1
    )
    gateway = start_gateway(tmp_path, text)
    try:
        yield gateway
    finally:
        gateway.stop()


def test_the_gateway_logs_a_route_no_provider_serves(
    keyless: RunningGateway, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metering, "server_errors", ErrorLog())  # no line held back by other tests
    key = keyless.key()
    for _ in range(3):
        r = keyless.post(
            "/v1/chat/completions", {"model": "orphan", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 500
    ok = keyless.post(
        "/v1/chat/completions", {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert ok.status_code == 200
    found = [line for line in lines(logs) if "failed:" in line]
    assert len(found) == 1, found
    assert "500 provider_not_configured (error) on route orphan, no upstream called" in found[0]
    assert key not in logs.text and "hi" not in found[0]
