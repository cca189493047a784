"""Retries, fallbacks, circuit breakers, deadlines and stream integrity, through a real
gateway against the fault-injecting mock upstream."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx2 as httpx
import orjson

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, start_gateway

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


def models_called(mock: MockUpstream) -> list[str]:
    return [r["body"]["model"] for r in mock.requests() if r["path"].endswith("/chat/completions")]


def sse_events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_retry_same_target_after_5xx(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=503, model="mock-small")
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200
    assert r.headers["x-switchyard-model"] == "small"
    assert r.headers["x-switchyard-attempts"] == "2"
    assert models_called(mock) == ["mock-small", "mock-small"]
    row = gateway.ledger_rows()[-1]
    assert (row["status"], row["attempts"], row["served_model"]) == ("ok", 2, "small")


def test_fallback_to_next_target_when_retries_exhausted(gateway: RunningGateway, mock: MockUpstream) -> None:
    for _ in range(2):  # first attempt + 1 retry on `small`
        mock.add_fault(kind="status", status=500, model="mock-small")
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200
    assert r.headers["x-switchyard-model"] == "large"
    assert models_called(mock) == ["mock-small", "mock-small", "mock-large"]


def test_client_error_from_upstream_is_not_retried(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(
        kind="status", status=400, model="mock-small", body={"error": {"message": "context too long"}}
    )
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 400
    assert "context too long" in r.json()["error"]["message"]
    assert models_called(mock) == ["mock-small"]
    assert gateway.ledger_rows()[-1]["status"] == "error"


def test_auth_failure_upstream_skips_to_fallback_without_retry(
    gateway: RunningGateway, mock: MockUpstream
) -> None:
    mock.add_fault(kind="status", status=401, model="mock-small")
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200 and r.headers["x-switchyard-model"] == "large"
    assert models_called(mock) == ["mock-small", "mock-large"]


def test_retry_after_is_honoured(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=429, model="mock-small", retry_after=1)
    t0 = time.perf_counter()
    r = gateway.post("/v1/chat/completions", CHAT)
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200 and r.headers["x-switchyard-model"] == "small"
    assert elapsed >= 0.95, f"retried after {elapsed:.3f}s, Retry-After said 1s"


def test_all_targets_rate_limited_returns_429_with_retry_after(
    gateway: RunningGateway, mock: MockUpstream
) -> None:
    for _ in range(4):
        mock.add_fault(kind="status", status=429, retry_after=30)
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "30"
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_all_targets_failing_returns_502_and_ledger_row(gateway: RunningGateway, mock: MockUpstream) -> None:
    for _ in range(4):
        mock.add_fault(kind="status", status=500)
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 502
    body = r.json()["error"]
    assert body["code"] == "upstream_error" and "HTTP 500" in body["message"]
    row = gateway.ledger_rows()[-1]
    assert (row["status"], row["http_status"], row["attempts"]) == ("error", 502, 4)


def test_circuit_breaker_opens_and_probes_again(gateway: RunningGateway, mock: MockUpstream) -> None:
    # threshold 3 (mock_policy): the first request fails twice on `small` (attempt + retry),
    # the second once more, which opens the breaker before its retry.
    for _ in range(3):
        mock.add_fault(kind="status", status=500, model="mock-small")
    for _ in range(2):
        assert gateway.post("/v1/chat/completions", CHAT).headers["x-switchyard-model"] == "large"
    mock.clear_requests()
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.headers["x-switchyard-model"] == "large" and r.headers["x-switchyard-attempts"] == "1"
    assert models_called(mock) == ["mock-large"], "an open breaker must skip the dead target"
    metrics = gateway.get("/metrics").text
    assert 'switchyard_circuit_open{model="small"} 1.0' in metrics
    time.sleep(1.1)  # open_seconds: 1 -> half-open, one probe
    mock.clear_requests()
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.headers["x-switchyard-model"] == "small"
    assert models_called(mock) == ["mock-small"]


def test_connection_refused_falls_back(tmp_path: Path, mock: MockUpstream) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    policy = f"""
providers:
  dead: {{type: openai, base_url: "http://127.0.0.1:{dead}/v1", api_key: k}}
  mock: {{type: openai, base_url: "{mock.base_url}/v1", api_key: k}}
models:
  a: {{provider: dead, price: {{input: 1, output: 1}}}}
  b: {{provider: mock, upstream: mock-b, price: {{input: 1, output: 1}}}}
routes:
  r: {{targets: [a, b], retries: 1}}
"""
    gw = start_gateway(tmp_path, policy)
    try:
        r = gw.post("/v1/chat/completions", {"model": "r", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and r.headers["x-switchyard-model"] == "b"
        assert r.headers["x-switchyard-attempts"] == "3"
    finally:
        gw.stop()


def test_stall_hits_attempt_timeout_then_deadline(tmp_path: Path, mock: MockUpstream) -> None:
    policy = f"""
providers:
  mock: {{type: openai, base_url: "{mock.base_url}/v1", api_key: k}}
models:
  a: {{provider: mock, upstream: mock-a, price: {{input: 1, output: 1}}}}
routes:
  r: {{targets: [a], retries: 5, attempt_timeout_s: 0.3, deadline_s: 1.0}}
"""
    gw = start_gateway(tmp_path, policy)
    try:
        for _ in range(10):
            mock.add_fault(kind="stall", seconds=3, model="mock-a")
        t0 = time.perf_counter()
        r = gw.post("/v1/chat/completions", {"model": "r", "messages": [{"role": "user", "content": "x"}]})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 504
        assert elapsed < 2.0, f"deadline 1s but the request took {elapsed:.2f}s"
    finally:
        mock.clear_faults()
        gw.stop()


def test_stream_failure_before_first_byte_is_retried(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=502, model="mock-small")
    r = gateway.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert all("error" not in orjson.loads(e) for e in events[:-1])


def test_stream_cut_mid_way_never_ends_clean(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=3, model="mock-small")
    r = gateway.post("/v1/chat/completions", {**CHAT, "stream": True})
    events = sse_events(r.text)
    assert "[DONE]" not in events
    last = orjson.loads(events[-1])
    assert last["error"]["code"] == "stream_interrupted"
    assert len(events) >= 3, "the chunks before the cut reach the client"
    assert models_called(mock) == ["mock-small"], "no silent retry once bytes went out"
    row = gateway.ledger_rows()[-1]
    assert row["status"] == "stream_broken"
    assert row["usage_estimated"] == 1 and row["output_tokens"] is not None


def test_malformed_sse_mid_stream_is_an_error_event(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="malformed_sse", after_chunks=2, model="mock-small")
    r = gateway.post("/v1/chat/completions", {**CHAT, "stream": True})
    events = sse_events(r.text)
    assert "[DONE]" not in events
    assert "error" in orjson.loads(events[-1])


def test_stream_stall_mid_way_hits_idle_timeout(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="stall_mid_stream", after_chunks=2, seconds=5, model="mock-small")
    t0 = time.perf_counter()
    r = gateway.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert time.perf_counter() - t0 < 4.5  # stream_idle_timeout_s: 2
    events = sse_events(r.text)
    assert "[DONE]" not in events and "error" in orjson.loads(events[-1])


def test_client_disconnect_is_recorded_with_partial_usage(
    gateway: RunningGateway, mock: MockUpstream
) -> None:
    mock.configure(itl_ms=200, tokens=50)
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST",
            gateway.base_url + "/chat/completions",
            json={**CHAT, "stream": True},
            headers=gateway.headers(),
        ) as resp,
    ):
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break
    deadline = time.monotonic() + 5
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = gateway.ledger_rows()
        if rows:
            break
        time.sleep(0.05)
    assert rows, "a disconnected stream still gets its ledger row"
    row = rows[-1]
    assert row["status"] == "client_disconnected"
    assert row["usage_estimated"] == 1
    assert row["output_tokens"] is not None and 0 < int(str(row["output_tokens"])) < 50


def test_client_disconnect_during_upstream_stall_is_noticed_at_once(
    tmp_path: Path, mock: MockUpstream
) -> None:
    """The gateway must not wait for the upstream's next chunk to notice the client left."""
    policy = f"""
providers:
  mock: {{type: openai, base_url: "{mock.base_url}/v1", api_key: k}}
models:
  a: {{provider: mock, upstream: mock-a, price: {{input: 1, output: 1}}}}
routes:
  r: {{targets: [a], stream_idle_timeout_s: 30}}
"""
    gw = start_gateway(tmp_path, policy)
    try:
        mock.add_fault(kind="stall_mid_stream", after_chunks=3, seconds=8, model="mock-a")
        body = {"model": "r", "messages": [{"role": "user", "content": "x"}], "stream": True}
        with (
            httpx.Client(timeout=10) as client,
            client.stream("POST", gw.base_url + "/chat/completions", json=body, headers=gw.headers()) as resp,
        ):
            seen = 0
            for line in resp.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 2:
                    break
        left = time.monotonic()
        rows: list[dict[str, object]] = []
        while time.monotonic() - left < 3 and not rows:
            time.sleep(0.05)
            rows = gw.ledger_rows()
        assert rows, "no ledger row within 3 s of the client leaving (the upstream stalls for 8 s)"
        assert rows[-1]["status"] == "client_disconnected"
    finally:
        mock.clear_faults()
        gw.stop()


def test_missing_upstream_usage_is_estimated_and_marked(gateway: RunningGateway, mock: MockUpstream) -> None:
    body = {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "mock-small",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "a" * 40},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
    }
    mock.add_fault(kind="status", status=200, body=body, model="mock-small")
    r = gateway.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "a" * 40
    row = gateway.ledger_rows()[-1]
    assert row["usage_estimated"] == 1
    assert row["output_tokens"] == 5  # tiktoken cl100k_base: "a" * 40 is 5 tokens
    assert row["input_tokens"] and row["input_tokens"] > 0
    assert row["cost_usd"] is not None
