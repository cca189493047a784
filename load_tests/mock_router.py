"""Turns one parsed HTTP request into a Plan: the reply, the fault to act out, the timing.

Control API (never recorded, never faulted):
  POST/GET/DELETE /_mock/faults, POST/GET /_mock/config, GET/DELETE /_mock/requests,
  POST /_mock/reset, GET /_mock/stats, GET /_mock/health.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import orjson

from load_tests import mock_anthropic, mock_openai, mock_responses
from load_tests.mock_batches import MockBatches, MockMessageBatches
from load_tests.mock_reply import Reply, anthropic_error, json_reply, openai_error
from load_tests.mock_state import FaultError, MockState, Settings

# Faults acted out while sending (the rest replace the reply while planning).
TIMED_FAULTS = frozenset({"reset", "stall", "stall_mid_stream", "cut_mid_stream", "malformed_sse"})
MALFORMED_JSON = b'{"id": '
HTML_BODY = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Plan:
    """A reply plus how to send it: delays in seconds and an optional timed fault."""

    reply: Reply
    fault: dict[str, Any] | None = None
    ttft_s: float = 0.0
    itl_s: float = 0.0

    @property
    def immediate(self) -> bool:
        """True when the reply can be written at once, with no delay or fault."""
        if self.fault is not None or self.ttft_s > 0:
            return False
        if self.itl_s == 0:
            return True
        if self.reply.events is None:
            return self.reply.n_paced == 0
        return not any(self.reply.paced)


class MockApp:
    """Routes requests; owns the id counter. One per server, shared by its connections."""

    def __init__(self, state: MockState) -> None:
        self.state = state
        self.batches = MockBatches(state.settings.tokens)
        self.message_batches = MockMessageBatches(state.settings.tokens, state.cache_lookup)
        self._ids = itertools.count(1)

    def plan(self, req: Request) -> Plan:
        """The reply to ``req``. A POST to a model endpoint carrying ``Idempotency-Key`` is
        answered as an idempotent provider does: the first request with a key runs, and a
        later one with the same key gets the first one's answer (a 200; errors are not kept)
        without running again (``MockState.replayed`` counts those)."""
        key = req.headers.get("idempotency-key")
        if (
            key is None
            or req.method != "POST"
            or req.path.startswith(("/_mock/", "/v1/files", "/v1/batches", "/v1/messages/batches"))
        ):
            return self._plan(req)
        first = self.state.replay(key)
        if first is not None:
            self.state.record({"method": req.method, "path": req.path, "headers": req.headers, "body": None})
            return first
        planned = self._plan(req)
        if planned.reply.status == 200 and planned.fault is None:
            self.state.remember(key, planned)
        return planned

    def _plan(self, req: Request) -> Plan:
        if req.path.startswith("/_mock/"):
            return Plan(self._control(req))
        if req.path.startswith("/v1/messages/batches"):  # Anthropic's (load_tests/mock_batches.py)
            self.state.record({"method": req.method, "path": req.path, "headers": req.headers, "body": None})
            return Plan(self.message_batches.handle(req.method, req.path, req.headers, req.body))
        if req.path.startswith(("/v1/files", "/v1/batches")):  # the batch API (load_tests/mock_batches.py)
            self.state.record({"method": req.method, "path": req.path, "headers": req.headers, "body": None})
            return Plan(self.batches.handle(req.method, req.path, req.headers, req.body, req.query))
        body: Any = None
        bad_json = False
        if req.body:
            try:
                body = orjson.loads(req.body)
            except orjson.JSONDecodeError:
                bad_json = True
                body = req.body.decode("utf-8", "replace")
        self.state.record({"method": req.method, "path": req.path, "headers": req.headers, "body": body})
        settings = self.state.settings
        model = body.get("model") if isinstance(body, dict) else None
        fault = self.state.pop_fault(model if isinstance(model, str) else None)
        anthropic = req.path.startswith("/v1/messages")
        if fault is not None and fault["kind"] not in TIMED_FAULTS:
            return Plan(self._fault_reply(fault, anthropic, str(model)))
        if bad_json or (req.method == "POST" and not isinstance(body, dict)):
            err = (
                anthropic_error(400, "invalid JSON body")
                if anthropic
                else openai_error(400, "invalid JSON body")
            )
            return Plan(err, fault)
        reply = self._route(req, body if isinstance(body, dict) else {}, settings.tokens)
        if fault is not None and fault["kind"] == "malformed_sse" and not reply.streaming:
            reply = Reply(body=MALFORMED_JSON)
            fault = None
        if reply.status != 200:
            return Plan(reply, fault)
        return Plan(reply, fault, settings.ttft_ms / 1000.0, settings.itl_ms / 1000.0)

    def _route(self, req: Request, body: dict[str, Any], tokens: int) -> Reply:
        rid = next(self._ids)
        now = int(time.time())
        key = (req.method, req.path.rstrip("/"))
        if key == ("POST", "/v1/chat/completions"):
            return mock_openai.chat_completion(body, tokens, rid, now)
        if key == ("POST", "/v1/messages"):
            return mock_anthropic.messages(body, req.headers, tokens, rid, self.state.cache_lookup)
        if key == ("POST", "/v1/messages/count_tokens"):
            return mock_anthropic.count_tokens(body, req.headers)
        if key == ("POST", "/v1/responses"):
            return mock_responses.responses(body, tokens, rid, self.state.cache_lookup)
        if key == ("POST", "/v1/completions"):
            return mock_openai.completion(body, tokens, rid, now)
        if key == ("POST", "/v1/embeddings"):
            return mock_openai.embeddings(body, rid)
        if key == ("GET", "/v1/models"):
            return mock_openai.models(now)
        if req.method == "GET" and req.path.startswith("/v1/models/"):
            return mock_openai.models(now, req.path[len("/v1/models/") :])
        if req.path.startswith("/v1/messages"):
            return anthropic_error(404, f"no route for {req.method} {req.path}")
        return openai_error(404, f"no route for {req.method} {req.path}", "not_found")

    def _fault_reply(self, fault: dict[str, Any], anthropic: bool, model: str) -> Reply:
        kind = fault["kind"]
        if kind == "status":
            status = int(fault["status"])
            message = str(fault.get("message", f"injected fault: status {status}"))
            if "body" in fault:
                body = orjson.dumps(fault["body"])
            elif anthropic:
                body = mock_anthropic.status_body(status, message)
            else:
                body = mock_openai.status_body(status, message)
            headers: tuple[tuple[str, str], ...] = ()
            if "retry_after" in fault:
                ra = fault["retry_after"]
                headers = (("retry-after", str(int(ra)) if float(ra).is_integer() else str(ra)),)
            return Reply(status=status, body=body, headers=headers)
        if kind == "malformed_json":
            return Reply(body=MALFORMED_JSON)
        if kind == "wrong_content_type":
            return Reply(body=HTML_BODY, content_type="text/html; charset=utf-8")
        size = int(fault.get("bytes", 1_000_000))
        rid = next(self._ids)
        if anthropic:
            return mock_anthropic.huge_message(model, rid, size)
        return mock_openai.huge_chat(model, rid, int(time.time()), size)

    def _control(self, req: Request) -> Reply:
        try:
            body = orjson.loads(req.body) if req.body else {}
        except orjson.JSONDecodeError:
            return openai_error(400, "invalid JSON body")
        route = (req.method, req.path.rstrip("/"))
        state = self.state
        try:
            if route == ("POST", "/_mock/faults"):
                faults = [body] if isinstance(body, dict) and "kind" in body else body.get("faults")
                if not isinstance(faults, list):
                    raise FaultError("expected {'faults': [...]}")
                return json_reply(200, {"queued": state.add_faults(faults)})
            if route == ("GET", "/_mock/faults"):
                return json_reply(200, {"faults": state.faults()})
            if route == ("DELETE", "/_mock/faults"):
                state.clear_faults()
                return json_reply(200, {"ok": True})
            if route == ("POST", "/_mock/config"):
                settings = state.configure(**body)
                return json_reply(200, _settings_dict(settings))
            if route == ("GET", "/_mock/config"):
                return json_reply(200, _settings_dict(state.settings))
            if route == ("GET", "/_mock/requests"):
                return json_reply(200, {"requests": state.requests()})
            if route == ("DELETE", "/_mock/requests"):
                state.clear_requests()
                return json_reply(200, {"ok": True})
            if route == ("POST", "/_mock/reset"):
                state.reset()
                return json_reply(200, {"ok": True})
            if route == ("GET", "/_mock/stats"):
                if state.replayed:  # only where Idempotency-Key replays happened (the shape stays)
                    return json_reply(200, {"served": state.served, "replayed": state.replayed})
                return json_reply(200, {"served": state.served})
            if route == ("GET", "/_mock/health"):
                return json_reply(200, {"ok": True})
        except (ValueError, TypeError, AttributeError) as exc:
            return openai_error(400, str(exc))
        return openai_error(404, f"no route for {req.method} {req.path}", "not_found")


def _settings_dict(settings: Settings) -> dict[str, Any]:
    return {"ttft_ms": settings.ttft_ms, "itl_ms": settings.itl_ms, "tokens": settings.tokens}
