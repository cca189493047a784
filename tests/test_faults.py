"""Every upstream fault kind, JSON and streaming, through a real gateway against the
fault-injecting mock: the client sees what the route's policy promises (retry, fallback, a
clean OpenAI-shaped error, never a clean end for a broken stream), and every request leaves
exactly one ledger row with the right status. Complements test_reliability.py (429 and
Retry-After, connection refused, deadlines, client disconnects, first breaker probe)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config.loader import load_policy
from gateway.core.types import Principal
from gateway.routing.attempts import run_with_fallback
from gateway.routing.breaker import BreakerBoard
from gateway.routing.router import Router
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, start_gateway

MB = 1024 * 1024


def fault_policy(mock_url: str, *, threshold: int = 1000, open_s: float = 1.0) -> str:
    return f"""
providers:
  mock: {{type: openai, base_url: "{mock_url}/v1", api_key: sk-upstream-canary-0123456789abcdef}}
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, output: 0.60}}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, output: 10.00}}}}
routes:
  auto:
    targets: [small, large]
    retries: 1
    attempt_timeout_s: 0.6
    stream_idle_timeout_s: 0.6
    deadline_s: 10
    cache: {{mode: "off"}}
breaker: {{failure_threshold: {threshold}, open_seconds: {open_s}}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as m:
        yield m


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("faults"), fault_policy(upstream.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


def called(mock: MockUpstream) -> list[str]:
    return [r["body"]["model"] for r in mock.requests() if r["path"].endswith("/chat/completions")]


def events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


# (fault specs queued on the mock, what the client must see, models the mock must be asked)
SMALL = "mock-small"
CASES: dict[str, tuple[list[dict[str, Any]], int, str | None, list[str]]] = {
    "500 once -> retry": ([{"kind": "status", "status": 500, "model": SMALL}], 200, "small", [SMALL] * 2),
    "502 twice -> fallback": (
        [{"kind": "status", "status": 502, "model": SMALL, "times": 2}],
        200,
        "large",
        [SMALL, SMALL, "mock-large"],
    ),
    "503 everywhere -> 503": (
        [{"kind": "status", "status": 503, "times": 4}],
        503,
        None,
        [SMALL] * 2 + ["mock-large"] * 2,
    ),
    "connection reset -> retry": ([{"kind": "reset", "model": SMALL}], 200, "small", [SMALL] * 2),
    "read timeout -> retry": ([{"kind": "stall", "seconds": 2, "model": SMALL}], 200, "small", [SMALL] * 2),
    "stall mid-body -> retry": (
        [{"kind": "stall_mid_stream", "after_chunks": 1, "seconds": 2, "model": SMALL}],
        200,
        "small",
        [SMALL] * 2,
    ),
    "cut mid-body -> retry": (
        [{"kind": "cut_mid_stream", "after_chunks": 1, "model": SMALL}],
        200,
        "small",
        [SMALL] * 2,
    ),
    "malformed JSON -> retry": ([{"kind": "malformed_json", "model": SMALL}], 200, "small", [SMALL] * 2),
    "wrong content type -> retry": (
        [{"kind": "wrong_content_type", "model": SMALL}],
        200,
        "small",
        [SMALL] * 2,
    ),
    "oversized body -> retry": (
        [{"kind": "huge", "bytes": 33 * MB, "model": SMALL}],
        200,
        "small",
        [SMALL] * 2,
    ),
    "timeouts everywhere -> 504": (
        [{"kind": "stall", "seconds": 2, "times": 4}],
        504,
        None,
        [SMALL] * 2 + ["mock-large"] * 2,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_json_faults(gw: RunningGateway, upstream: MockUpstream, name: str) -> None:
    faults, status, served, models = CASES[name]
    upstream.reset()
    upstream.add_faults(faults)
    before = len(gw.ledger_rows())
    r = gw.post("/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": name}]})
    upstream.clear_faults()
    assert r.status_code == status, r.text
    assert called(upstream) == models
    rows = gw.ledger_rows()[before:]
    assert len(rows) == 1, "exactly one ledger row per request"
    row = rows[0]
    assert row["http_status"] == status and row["attempts"] == len(models)
    if served is not None:
        assert r.headers["x-switchyard-model"] == served
        assert r.json()["choices"][0]["message"]["content"].startswith("echo:")
        assert (row["status"], row["served_model"]) == ("ok", served)
        assert row["cost_usd"] is not None
    else:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert row["status"] == "error" and row["error_code"] == err["code"]


def test_a_large_but_legal_body_is_relayed(gw: RunningGateway, upstream: MockUpstream) -> None:
    upstream.reset()
    upstream.add_fault(kind="huge", bytes=2 * MB, model=SMALL)
    r = gw.post("/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": "big"}]})
    assert r.status_code == 200
    assert len(r.json()["choices"][0]["message"]["content"]) == 2 * MB
    assert called(upstream) == [SMALL]


STREAM_CASES: dict[str, tuple[list[dict[str, Any]], bool, str, list[str]]] = {
    # before the first byte: retried/fell back invisibly, the stream ends clean
    "503 before first byte": ([{"kind": "status", "status": 503, "model": SMALL}], True, "ok", [SMALL] * 2),
    "reset before first byte": ([{"kind": "reset", "model": SMALL}], True, "ok", [SMALL] * 2),
    "stall before first byte": (
        [{"kind": "stall", "seconds": 2, "model": SMALL, "times": 2}],
        True,
        "ok",
        [SMALL, SMALL, "mock-large"],
    ),
    "wrong content type": ([{"kind": "wrong_content_type", "model": SMALL}], True, "ok", [SMALL] * 2),
    "JSON instead of SSE": ([{"kind": "huge", "bytes": 1000, "model": SMALL}], True, "ok", [SMALL] * 2),
    # after bytes went out: an error event, never [DONE], never a silent retry
    "stall mid-stream": (
        [{"kind": "stall_mid_stream", "after_chunks": 2, "seconds": 3, "model": SMALL}],
        False,
        "stream_broken",
        [SMALL],
    ),
    "cut mid-stream": (
        [{"kind": "cut_mid_stream", "after_chunks": 2, "model": SMALL}],
        False,
        "stream_broken",
        [SMALL],
    ),
    "malformed SSE": (
        [{"kind": "malformed_sse", "after_chunks": 2, "model": SMALL}],
        False,
        "stream_broken",
        [SMALL],
    ),
    "malformed SSE then close": (
        [{"kind": "malformed_sse", "after_chunks": 1, "close": True, "model": SMALL}],
        False,
        "stream_broken",
        [SMALL],
    ),
}


@pytest.mark.parametrize("name", list(STREAM_CASES))
def test_stream_faults(gw: RunningGateway, upstream: MockUpstream, name: str) -> None:
    faults, clean, status, models = STREAM_CASES[name]
    upstream.reset()
    upstream.add_faults(faults)
    before = len(gw.ledger_rows())
    body = {"model": "auto", "messages": [{"role": "user", "content": name}], "stream": True}
    r = gw.post("/v1/chat/completions", body)
    upstream.clear_faults()
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert called(upstream) == models
    rows = gw.ledger_rows()[before:]
    assert len(rows) == 1
    assert rows[0]["status"] == status
    if clean:
        assert evs[-1] == "[DONE]"
        assert all("error" not in orjson.loads(e) for e in evs[:-1])
        assert rows[0]["http_status"] == 200
    else:
        assert "[DONE]" not in evs, "a broken stream must never look like a clean success"
        last = orjson.loads(evs[-1])
        assert last["error"]["code"] == "stream_interrupted"
        assert len(evs) >= 2, "the chunks before the fault reach the client"
        assert rows[0]["http_status"] == 502 and rows[0]["error_code"] == "stream_interrupted"
        assert rows[0]["usage_estimated"] == 1 and rows[0]["output_tokens"] is not None


def test_breaker_opens_probes_reopens_and_closes(tmp_path: Path, upstream: MockUpstream) -> None:
    upstream.reset()
    gw = start_gateway(tmp_path, fault_policy(upstream.base_url, threshold=2, open_s=0.5))
    chat = {"model": "auto", "messages": [{"role": "user", "content": "breaker"}]}
    try:
        upstream.add_fault(kind="status", status=500, model=SMALL, times=2)
        assert gw.post("/v1/chat/completions", chat).headers["x-switchyard-model"] == "large"
        assert gw.app_state.services.breakers.states()["small"] == "open"
        upstream.clear_requests()
        assert gw.post("/v1/chat/completions", chat).headers["x-switchyard-model"] == "large"
        assert called(upstream) == ["mock-large"], "open: the dead target is skipped"
        # half-open: one probe; it fails -> open again at once
        time.sleep(0.6)
        assert gw.app_state.services.breakers.states()["small"] == "half_open"
        upstream.clear_requests()
        upstream.add_fault(kind="status", status=500, model=SMALL)
        assert gw.post("/v1/chat/completions", chat).headers["x-switchyard-model"] == "large"
        assert called(upstream) == [SMALL, "mock-large"], "one probe, no retry on a failed probe"
        assert gw.app_state.services.breakers.states()["small"] == "open"
        # half-open again: the probe succeeds -> closed
        time.sleep(0.6)
        upstream.clear_requests()
        r = gw.post("/v1/chat/completions", chat)
        assert r.headers["x-switchyard-model"] == "small" and called(upstream) == [SMALL]
        assert gw.app_state.services.breakers.states()["small"] == "closed"
        assert 'switchyard_circuit_open{model="small"} 0.0' in gw.get("/metrics").text
        rows = gw.ledger_rows()
        assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    finally:
        gw.stop()


def test_probe_slot_is_freed_when_an_attempt_ends_without_verdict(tmp_path: Path) -> None:
    """A half-open probe that is cancelled (or fails outside the upstream) must not leave the
    breaker waiting for a verdict forever: the next request may probe."""
    path = tmp_path / "p.yaml"
    path.write_text(fault_policy("http://127.0.0.1:9"))
    policy = load_policy(path)
    plan = Router(policy).plan("auto", Principal("t", None, None), "chat")
    board = BreakerBoard(failure_threshold=1, open_seconds=0.05)
    for name in ("small", "large"):
        board.get(name).failure()
    time.sleep(0.06)

    async def cancelled(target: Any, timeout: float) -> str:
        raise asyncio.CancelledError

    async def broken(target: Any, timeout: float) -> str:
        raise RuntimeError("a bug outside the upstream")

    async def fine(target: Any, timeout: float) -> str:
        return target.model

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run_with_fallback(plan, cancelled, board, started=time.perf_counter()))
    with pytest.raises(RuntimeError):
        asyncio.run(run_with_fallback(plan, broken, board, started=time.perf_counter()))
    outcome = asyncio.run(run_with_fallback(plan, fine, board, started=time.perf_counter()))
    assert outcome.value == "small"
    assert board.states()["small"] == "closed"


def test_oversized_sse_event_is_a_clean_upstream_error(tmp_path: Path) -> None:
    """A real loopback server whose stream starts with one 9 MB SSE line (past the stream
    reader's bound, ``providers.sse.MAX_EVENT_BYTES`` = 8 MiB): the gateway answers with an
    OpenAI-shaped 502 and records it, never a 500, and its memory stays bounded."""
    import socket
    import threading

    line = (
        b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "' + b"a" * 9_000_000 + b'"}}]}\n\n'
    )
    reply = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        + line
        + b"data: [DONE]\n\n"
    )
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        h.split(b":")[1]
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length")
                    )
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                with contextlib.suppress(OSError):  # the gateway hangs up once it has had enough
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    policy = f"""
providers:
  big: {{type: openai, base_url: "http://127.0.0.1:{port}/v1", api_key: k}}
models:
  a: {{provider: big, price: {{input: 1, output: 1}}}}
routes:
  r: {{targets: [a], retries: 1}}
"""
    gw = start_gateway(tmp_path, policy)
    try:
        body = {"model": "r", "messages": [{"role": "user", "content": "x"}], "stream": True}
        r = gw.post("/v1/chat/completions", body)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "stream_interrupted"
        assert "oversized event" in r.json()["error"]["message"]
        rows = gw.ledger_rows()
        assert len(rows) == 1 and rows[0]["status"] == "error" and rows[0]["attempts"] == 2
    finally:
        gw.stop()
        stop.set()
        thread.join(5)
        server.close()
