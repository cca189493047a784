"""OpenTelemetry traces (GenAI semantic conventions) from a real gateway: with the SDK's
in-memory exporter, and over OTLP/HTTP to a local receiver. Off by default, and then the
gateway never imports the trace SDK or an exporter (FastAPI imports the OTel API, and
redis-py its metrics SDK when installed)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from gateway.telemetry.tracing import build_tracer
from load_tests.mock_upstream import MockUpstream
from tests.conftest import require_module
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

require_module("opentelemetry.sdk")  # the otel extra: a skip outside CI, a failure under CI=true
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

HELLO = [{"role": "user", "content": "hello there"}]


def _spans(gw: RunningGateway, exporter: InMemorySpanExporter) -> dict[str, Any]:
    gw.app_state.services.tracer.provider.force_flush()
    return {s.attributes["switchyard.request_id"]: s for s in exporter.get_finished_spans()}


def test_spans_carry_genai_attributes(gateway: RunningGateway, mock: MockUpstream) -> None:
    exporter = InMemorySpanExporter()
    tracer = build_tracer(None, exporter=exporter)
    assert tracer is not None
    gateway.app_state.gateway.swap(dataclasses.replace(gateway.app_state.services, tracer=tracer))
    ok = gateway.post("/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0})
    hit = gateway.post("/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0})
    streamed = gateway.post(
        "/v1/chat/completions",
        {"model": "anthropic-first", "messages": HELLO, "stream": True, "max_tokens": 20},
    )
    emb = gateway.post("/v1/embeddings", {"model": "embed", "input": "hi"})
    mock.add_fault(kind="status", status=500, model="mock-large", times=10)
    failed = gateway.post("/v1/chat/completions", {"model": "restricted", "messages": HELLO})
    assert [r.status_code for r in (ok, hit, streamed, emb, failed)] == [200, 200, 200, 200, 502]
    spans = _spans(gateway, exporter)

    s = spans[ok.headers["x-request-id"]]
    assert s.name == "chat small" and s.kind == SpanKind.CLIENT
    a = s.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "auto"
    assert a["gen_ai.response.model"] == "mock-small"
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.system"] == "openai"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] == 8
    row = next(r for r in gateway.ledger_rows() if r["request_id"] == ok.headers["x-request-id"])
    assert a["switchyard.cost_usd"] == row["cost_usd"]
    assert a["switchyard.baseline_cost_usd"] == row["baseline_cost_usd"]
    assert a["switchyard.route"] == "auto" and a["switchyard.cache"] == "miss"
    assert a["switchyard.tenant"] == "team-a"
    assert s.end_time > s.start_time

    h = spans[hit.headers["x-request-id"]].attributes
    assert h["switchyard.cache"] == "hit" and h["switchyard.cost_usd"] == "0E-10"
    assert "gen_ai.response.model" not in h

    st = spans[streamed.headers["x-request-id"]].attributes
    assert st["gen_ai.provider.name"] == "anthropic" and st["gen_ai.response.model"] == "claude-mock"
    assert st["gen_ai.usage.output_tokens"] > 0

    e = spans[emb.headers["x-request-id"]]
    assert e.name == "embeddings embed" and e.attributes["gen_ai.operation.name"] == "embeddings"

    f = spans[failed.headers["x-request-id"]]
    assert f.status.status_code == StatusCode.ERROR
    assert f.attributes["error.type"] == "upstream_error"
    # secrets never reach span attributes
    for span in spans.values():
        text = repr(dict(span.attributes))
        assert "canary" not in text and "sk-sy-" not in text


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_http_export_to_a_local_receiver(tmp_path: Path, mock: MockUpstream) -> None:
    _Receiver.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
    try:
        gw = start_gateway(tmp_path, mock_policy(mock.base_url), otlp_endpoint=endpoint)
        try:
            r = gw.post("/v1/chat/completions", {"model": "auto", "messages": HELLO})
            assert r.status_code == 200
        finally:
            gw.stop()  # shutdown flushes the batch
    finally:
        server.shutdown()
        server.server_close()
    assert _Receiver.bodies, "no OTLP export arrived"
    spans = []
    for path, body in _Receiver.bodies:
        assert path == "/v1/traces"
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            service = {kv.key: kv.value.string_value for kv in rs.resource.attributes}["service.name"]
            assert service == "switchyard"
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    (span,) = [s for s in spans if s.name == "chat small"]
    attrs = {kv.key: kv.value for kv in span.attributes}
    assert attrs["gen_ai.request.model"].string_value == "auto"
    assert attrs["gen_ai.usage.output_tokens"].int_value == 8
    assert attrs["switchyard.request_id"].string_value == r.headers["x-request-id"]


def test_tracing_off_by_default_and_otel_never_imported() -> None:
    code = (
        "import sys, asyncio\n"
        "from gateway.api.app import create_app\n"
        "import gateway.flow.pipeline\n"
        "create_app()\n"
        "sdk = [m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', 'opentelemetry.exporter'))]\n"
        "assert not sdk, sdk\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert build_tracer(None) is None
