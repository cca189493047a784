"""Usage and cost end to end: a real gateway in front of a scripted upstream (a real HTTP server
on loopback speaking OpenAI and Anthropic, JSON and SSE, with the exact usage objects those
vendors send: cached tokens, reasoning tokens, 5-minute/1-hour cache writes, or no usage).

The same request costs exactly the same streamed and not streamed, equal to the hand-computed
golden values of test_pricing_golden.py; missing usage is counted with the tokenizer and the
row is marked estimated; savings are attributed to a cause.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from gateway.ledger.tokens import count_prompt_tokens, count_text
from tests.gateway_harness import RunningGateway, start_gateway

D = Decimal
REPLY = "Paris is the capital of France."
PIECES = ["Paris", " is the", " capital", " of France."]
OPENAI_USAGE = {
    "gpt-4o": {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920},
        "completion_tokens_details": {"reasoning_tokens": 0},
    },
    "o3": {
        "prompt_tokens": 1000,
        "completion_tokens": 1500,
        "total_tokens": 2500,
        "completion_tokens_details": {"reasoning_tokens": 1200},
    },
}
ANTHROPIC_USAGE = {
    "input_tokens": 50,
    "cache_read_input_tokens": 10_000,
    "cache_creation_input_tokens": 3000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
    "output_tokens": 400,
}


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one response per connection; streams end at close

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/v1/messages":
            self._anthropic(body)
        else:
            self._openai(body)

    def _send(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.end_headers()

    def _event(self, data: dict[str, Any], name: str | None = None) -> None:
        head = f"event: {name}\n" if name else ""
        self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _openai(self, body: dict[str, Any]) -> None:
        model = body["model"]
        usage = OPENAI_USAGE.get(model)  # None: this upstream reports no usage at all
        head = {"id": "chatcmpl-1", "created": 1, "model": model}
        if not body.get("stream"):
            self._send("application/json")
            message = {"role": "assistant", "content": REPLY}
            reply = {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
            if usage is not None:
                reply["usage"] = usage
            self.wfile.write(json.dumps(reply).encode())
            return
        self._send("text/event-stream")
        chunk = {**head, "object": "chat.completion.chunk"}
        self._event(
            {
                **chunk,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            }
        )
        for piece in PIECES:
            self._event(
                {**chunk, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            )
        self._event({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            self._event({**chunk, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _anthropic(self, body: dict[str, Any]) -> None:
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"]}
        if not body.get("stream"):
            self._send("application/json")
            reply = {
                **message,
                "content": [{"type": "text", "text": REPLY}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": ANTHROPIC_USAGE,
            }
            self.wfile.write(json.dumps(reply).encode())
            return
        self._send("text/event-stream")
        start_usage = {**ANTHROPIC_USAGE, "output_tokens": 1}
        self._event(
            {"type": "message_start", "message": {**message, "content": [], "usage": start_usage}},
            "message_start",
        )
        self._event(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )
        for piece in PIECES:
            delta = {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            }
            self._event(delta, "content_block_delta")
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 400}}
        self._event(end, "message_delta")
        self._event({"type": "message_stop"}, "message_stop")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gw(tmp_path: Path, upstream: str) -> Iterator[RunningGateway]:
    policy = f"""
providers:
  up: {{type: openai, base_url: "{upstream}/v1", api_key: sk-up-0123456789}}
  upa: {{type: anthropic, base_url: "{upstream}", api_key: sk-ant-0123456789}}
  engine: {{type: openai, base_url: "{upstream}/v1", key_required: false, self_hosted: true}}
models:
  gpt-4o: {{provider: up}}
  o3: {{provider: up}}
  claude-sonnet-4-5: {{provider: upa}}
  gpt-4o-mini: {{provider: up}}
  local: {{provider: engine, upstream: local-llama, price: {{input: "0.01", output: "0.02"}}}}
routes:
  cheap: {{targets: [gpt-4o-mini], baseline: gpt-4o}}
  own: {{targets: [local], baseline: gpt-4o}}
"""
    gateway = start_gateway(tmp_path, policy)
    try:
        yield gateway
    finally:
        gateway.stop()


def chat(
    gw: RunningGateway, model: str, *, stream: bool, content: str = "capital of France?", **extra: Any
) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream, **extra}
    if not stream:
        r = gw.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == REPLY
        return str(r.headers["x-request-id"])
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gw.base_url + "/chat/completions", json=body, headers=gw.headers()) as r,
    ):
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        text = "".join(
            (c["choices"][0]["delta"].get("content") or "")
            for c in (json.loads(ln[6:]) for ln in lines[:-1])
            if c.get("choices")
        )
        assert text == REPLY
        return str(r.headers["x-request-id"])


def row_of(gw: RunningGateway, request_id: str) -> dict[str, Any]:
    (row,) = [r for r in gw.ledger_rows() if r["request_id"] == request_id]
    return row


@pytest.mark.parametrize(
    ("model", "cost", "tokens"),
    [
        # (2006 - 1920) x 2.50 + 1920 x 1.25 + 300 x 10.00 = 5615 per 1M
        ("gpt-4o", "0.0056150000", (2006, 1920, None, 300)),
        # 1000 x 2.00 + 1500 (1200 of them reasoning) x 8.00 = 14000 per 1M
        ("o3", "0.0140000000", (1000, None, None, 1500)),
        # 50 x 3 + 10000 x 0.30 + 1000 x 3.75 + 2000 x 6.00 + 400 x 15 = 24900 per 1M
        ("claude-sonnet-4-5", "0.0249000000", (13_050, 10_000, 3000, 400)),
    ],
)
def test_streamed_and_not_streamed_cost_exactly_the_same(
    gw: RunningGateway, model: str, cost: str, tokens: tuple[int | None, ...]
) -> None:
    plain = row_of(gw, chat(gw, model, stream=False))
    streamed = row_of(gw, chat(gw, model, stream=True))
    for row in (plain, streamed):
        assert row["cost_usd"] == cost
        assert (
            row["input_tokens"],
            row["cached_tokens"],
            row["cache_write_tokens"],
            row["output_tokens"],
        ) == tokens
        assert row["usage_estimated"] == 0 and row["status"] == "ok"
    assert (plain["stream"], streamed["stream"]) == (0, 1)


def test_missing_usage_is_counted_with_the_tokenizer_and_marked(gw: RunningGateway) -> None:
    body = {"messages": [{"role": "user", "content": "capital of France?"}]}
    prompt = count_prompt_tokens(body, "gpt-4o-mini")  # 3 + 1 + 4 + 3
    assert prompt == 11
    output = count_text(REPLY, "gpt-4o-mini")
    assert output == 7
    # 11 x 0.15 + 7 x 0.60 = 1.65 + 4.2 = 5.85 per 1M
    for stream in (False, True):
        row = row_of(gw, chat(gw, "gpt-4o-mini", stream=stream))
        assert row["usage_estimated"] == 1
        assert (row["input_tokens"], row["output_tokens"]) == (prompt, output)
        assert row["cost_usd"] == "0.0000058500"


def test_savings_are_attributed_to_a_cause(gw: RunningGateway) -> None:
    routed = row_of(gw, chat(gw, "cheap", stream=False))
    assert routed["savings_cause"] == "routing"
    # baseline gpt-4o, no cache discount: 11 x 2.50 + 7 x 10 = 97.5 per 1M
    assert routed["baseline_cost_usd"] == "0.0000975000" and routed["cost_usd"] == "0.0000058500"
    first = row_of(gw, chat(gw, "cheap", stream=False, temperature=0))
    hit = row_of(gw, chat(gw, "cheap", stream=True, temperature=0))
    assert first["cache_status"] == "miss" and hit["cache_status"] == "hit"
    assert hit["savings_cause"] == "exact_cache" and hit["cost_usd"] == "0.0000000000"
    own = row_of(gw, chat(gw, "own", stream=False, content="hello"))
    assert own["savings_cause"] == "self_hosted" and own["provider"] == "engine"
    direct = row_of(gw, chat(gw, "gpt-4o", stream=False))
    assert direct["savings_cause"] == "none"  # its own baseline
    metrics = gw.get("/metrics").text
    lines = [ln for ln in metrics.splitlines() if ln.startswith("switchyard_savings_usd_total{")]
    causes = {ln.split('cause="')[1].split('"')[0] for ln in lines}
    assert causes == {"routing", "exact_cache", "self_hosted"}
    routing = [ln for ln in lines if 'cause="routing"' in ln and 'route="cheap"' in ln]
    # two routed misses saved 97.5 - 5.85 = 91.65 per 1M each
    assert float(routing[0].split()[-1]) == pytest.approx(2 * 91.65e-6)
