"""Wire conformance: what the gateway sends validates against the official SDKs' own types.

The ``openai`` and ``anthropic`` SDKs ship pydantic models generated from the vendors'
published API specs. Raw HTTP here (httpx2: no SDK parsing that could paper over a shape
problem) against the real gateway and the mock upstream; every JSON body and every SSE event
goes through ``conforms``, which is stricter than the SDKs themselves:

- ``strict=True`` validation: no coercion (a string ``"1"`` is not an int, an int is not a
  string), enums (``Literal``) must match, required fields must be present;
- fields the SDK type does not know are reported with their path (the SDK models accept and
  keep them silently, in ``model_extra``), at any depth;
- a few keys the published spec requires but the SDK types default (``finish_reason`` in a
  chunk's choice, ``param`` and ``code`` in an OpenAI error) must be present, null or not.

``EXTENSIONS`` lists the only fields allowed beyond the SDK types, each with its reason.

Runs on any clone (no file outside the repository); ``test_validator_rejects_bad_bodies``
proves each check can fail. The SDK types are generated from OpenAI's and Anthropic's
published specs, so no spec file outside the repository is read."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import httpx2 as httpx
import pytest
from anthropic.types import ErrorResponse as AnthropicError
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.shared import ErrorObject
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway

HELLO = [{"role": "user", "content": "hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOL = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
MESSAGES_TOOL = {
    "name": "lookup",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}


# --------------------------------------------------------------------------- the validator
class OpenAIError(BaseModel):
    """OpenAI's error envelope (the SDK types the inner object only)."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorObject


class ModelList(BaseModel):
    """``GET /v1/models``: the SDK pages over ``data``; the envelope is {object: list, data}."""

    model_config = ConfigDict(extra="forbid")
    object: Literal["list"]
    data: list[Model]


# Keys the published spec requires that the SDK types give a default: present (null allowed).
PRESENT: dict[type[BaseModel], tuple[str, ...]] = {
    ChunkChoice: ("finish_reason",),
    ErrorObject: ("message", "type", "param", "code"),
}
# The only fields allowed beyond the SDK types: (type, field) -> why.
EXTENSIONS: dict[tuple[str, str], str] = {
    ("Response", "store"): "echoed from the request as OpenAI's API does; tests/test_responses.py reads it",
    ("ErrorObject", "problems"): "/admin/policy/reload lists every policy problem (an admin endpoint)",
}
_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


class AnthropicPing(BaseModel):
    """``event: ping``: Anthropic's keep-alive, documented, handled outside the SDK's event union."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["ping"]


class NotConformant(AssertionError):
    pass


def _walk(value: Any, path: str) -> Iterator[str]:
    """Problems below ``value`` (a validated SDK object): unknown fields, missing spec keys."""
    if isinstance(value, BaseModel):
        for key in value.model_extra or {}:
            if (type(value).__name__, key) not in EXTENSIONS:
                yield f"{path}.{key}: not a field of {type(value).__name__}"
        for cls, keys in PRESENT.items():
            if isinstance(value, cls):
                for key in keys:
                    if key not in value.model_fields_set:
                        yield f"{path}.{key}: required by the spec, absent"
        for name in value.model_fields_set:
            if name in type(value).model_fields:
                yield from _walk(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")


def conforms(kind: Any, data: Any) -> Any:
    """Validate ``data`` (parsed JSON) as the SDK type ``kind``; raise NotConformant listing
    every problem; return the validated object."""
    adapter = _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    name = getattr(kind, "__name__", str(kind))
    try:
        obj = adapter.validate_python(data, strict=True)
    except ValidationError as exc:
        raise NotConformant(f"{name}: {exc}\ninstance: {json.dumps(data)[:2000]}") from None
    problems = list(_walk(obj, "<root>"))
    if problems:
        raise NotConformant(f"{name}:\n  " + "\n  ".join(problems) + f"\ninstance: {json.dumps(data)[:2000]}")
    return obj


# --------------------------------------------------------------------------- HTTP helpers
def post(gateway: RunningGateway, path: str, body: Any, **kw: Any) -> httpx.Response:
    r = gateway.post(path, body, **kw)
    assert "Traceback" not in r.text
    return r


def sse(
    gateway: RunningGateway, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[tuple[str | None, Any]]:
    """POST a streaming request; every event as (``event:`` name or None, parsed ``data:``),
    up to OpenAI's ``[DONE]`` (which ends chat/completions streams and must be last)."""
    out: list[tuple[str | None, Any]] = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", gateway.url + path, json=body, headers=headers or gateway.headers()) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        event: str | None = None
        done = False
        for line in r.iter_lines():
            if not line:
                event = None
                continue
            assert not done, f"data after [DONE]: {line!r}"
            if line.startswith("event: "):
                event = line[len("event: ") :]
                continue
            assert line.startswith("data: "), f"unexpected SSE line {line!r}"
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            out.append((event, json.loads(payload)))
    return out


def chat_stream(gateway: RunningGateway, body: dict[str, Any]) -> list[Any]:
    events = sse(gateway, "/v1/chat/completions", body)
    assert all(name is None for name, _ in events)
    return [data for _, data in events]


def chunks_conform(chunks: Iterable[Any]) -> None:
    for chunk in chunks:
        conforms(ChatCompletionChunk, chunk)


# --------------------------------------------------------------------------- chat
@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_chat_completion_response(gateway: RunningGateway, route: str, tools: bool) -> None:
    body: dict[str, Any] = {"model": route, "messages": HELLO}
    if tools:
        body["tools"] = TOOLS
    r = post(gateway, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    done = conforms(ChatCompletion, r.json())
    assert done.choices[0].finish_reason == ("tool_calls" if tools else "stop")


def test_chat_completion_response_with_n(gateway: RunningGateway) -> None:
    r = post(gateway, "/v1/chat/completions", {"model": "auto", "messages": HELLO, "n": 2, "stop": "pad"})
    assert len(conforms(ChatCompletion, r.json()).choices) == 2


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "usage"])
def test_stream_chunks(gateway: RunningGateway, route: str, tools: bool, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": route, "messages": HELLO, "stream": True}
    if tools:
        body["tools"] = TOOLS
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    chunks = chat_stream(gateway, body)
    assert len(chunks) >= 3
    chunks_conform(chunks)
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert usage_chunks == [chunks[-1]] and chunks[-1]["choices"] == []
    else:
        assert usage_chunks == []
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["tool_calls" if tools else "stop"]


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_cache_hit_replays_conform(gateway: RunningGateway, tools: bool) -> None:
    body: dict[str, Any] = {"model": "auto", "messages": HELLO, "temperature": 0}
    if tools:
        body["tools"] = TOOLS
    first = post(gateway, "/v1/chat/completions", body)
    assert first.headers["x-switchyard-cache"] == "miss"
    hit = post(gateway, "/v1/chat/completions", body)
    assert hit.headers["x-switchyard-cache"] == "hit"
    conforms(ChatCompletion, hit.json())
    for include_usage in (False, True):
        chunks = chat_stream(
            gateway, {**body, "stream": True, "stream_options": {"include_usage": include_usage}}
        )
        chunks_conform(chunks)
        assert bool(chunks[-1].get("usage")) is include_usage


def test_cache_hit_of_a_streamed_answer_conforms(gateway: RunningGateway) -> None:
    body: dict[str, Any] = {"model": "anthropic-first", "messages": HELLO, "temperature": 0, "stream": True}
    chat_stream(gateway, body)  # fills the cache from an assembled stream
    hit = post(gateway, "/v1/chat/completions", {**body, "stream": False})
    assert hit.headers["x-switchyard-cache"] == "hit"
    conforms(ChatCompletion, hit.json())
    chunks_conform(chat_stream(gateway, body))


# --------------------------------------------------------------------------- other OpenAI endpoints
def test_models_list_and_retrieve(gateway: RunningGateway) -> None:
    r = gateway.get("/v1/models", headers=gateway.headers())
    assert r.status_code == 200
    listed = conforms(ModelList, r.json())
    assert {m.id for m in listed.data} >= {"auto", "small", "claude"}
    one = gateway.get("/v1/models/auto", headers=gateway.headers())
    assert one.status_code == 200, one.text
    assert conforms(Model, one.json()).id == "auto"


def test_embeddings(gateway: RunningGateway) -> None:
    r = post(gateway, "/v1/embeddings", {"model": "embed", "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    assert len(conforms(CreateEmbeddingResponse, r.json()).data) == 2


def test_completions(gateway: RunningGateway) -> None:
    r = post(gateway, "/v1/completions", {"model": "legacy", "prompt": "hi"})
    assert r.status_code == 200, r.text
    assert conforms(Completion, r.json()).choices[0].text


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_responses_and_their_stream_events(gateway: RunningGateway, tools: bool) -> None:
    body: dict[str, Any] = {"model": "small", "input": "hello"}
    if tools:
        body["tools"] = [RESPONSES_TOOL]
    r = post(gateway, "/v1/responses", body)
    assert r.status_code == 200, r.text
    done = conforms(Response, r.json())
    assert done.status == "completed"
    events = sse(gateway, "/v1/responses", {**body, "stream": True})
    for name, data in events:
        assert name == data["type"]
        conforms(ResponseStreamEvent, data)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    final = conforms(Response, events[-1][1]["response"])
    assert final.output[0].type == ("function_call" if tools else "message")


# --------------------------------------------------------------------------- Anthropic Messages
@pytest.mark.parametrize("model", ["anthropic-first", "small"], ids=["pass-through", "translated"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_messages_and_their_stream_events(gateway: RunningGateway, model: str, tools: bool) -> None:
    body: dict[str, Any] = {"model": model, "max_tokens": 20, "messages": HELLO}
    if tools:
        body["tools"] = [MESSAGES_TOOL]
    headers = {"x-api-key": gateway.key()}
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + "/v1/messages", json=body, headers=headers)
    assert r.status_code == 200, r.text
    msg = conforms(Message, r.json())
    assert msg.stop_reason == ("tool_use" if tools else "end_turn") or msg.stop_reason == "max_tokens"
    events = sse(gateway, "/v1/messages", {**body, "stream": True}, headers)
    for name, data in events:
        assert name == data["type"]
        conforms(AnthropicPing if name == "ping" else RawMessageStreamEvent, data)
    kinds = [name for name, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds


def test_messages_count_tokens(gateway: RunningGateway) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(
            gateway.url + "/v1/messages/count_tokens",
            json={"model": "anthropic-first", "messages": HELLO},
            headers={"x-api-key": gateway.key()},
        )
    assert r.status_code == 200, r.text
    assert conforms(MessageTokensCount, r.json()).input_tokens > 0


def test_messages_errors(gateway: RunningGateway, mock: MockUpstream) -> None:
    url = gateway.url + "/v1/messages"
    ok = {"model": "small", "max_tokens": 5, "messages": HELLO}
    key = {"x-api-key": gateway.key()}
    with httpx.Client(timeout=30) as c:
        cases = [
            (401, c.post(url, json=ok)),
            (401, c.post(url, json=ok, headers={"x-api-key": "sk-sy-wrong"})),
            (400, c.post(url, content=b"{nope", headers=key)),
            (400, c.post(url, json={**ok, "max_tokens": None}, headers=key)),
            (404, c.post(url, json={**ok, "model": "nope"}, headers=key)),
        ]
    for status, r in cases:
        assert r.status_code == status, (status, r.text)
        assert r.headers["content-type"].startswith("application/json")
        conforms(AnthropicError, r.json())


def test_messages_mid_stream_failure_is_an_error_event(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=2)
    body = {"model": "small", "max_tokens": 20, "messages": HELLO, "stream": True}
    events = sse(gateway, "/v1/messages", body, {"x-api-key": gateway.key()})
    *before, (last_name, last) = events
    for name, data in before:
        conforms(AnthropicPing if name == "ping" else RawMessageStreamEvent, data)
    assert last_name == "error"
    conforms(AnthropicError, last)


# --------------------------------------------------------------------------- OpenAI errors
def test_error_bodies(gateway: RunningGateway, mock: MockUpstream) -> None:
    chat = "/v1/chat/completions"
    ok = {"model": "auto", "messages": HELLO}
    with httpx.Client(timeout=30) as c:
        cases: list[tuple[int, httpx.Response]] = [
            (401, c.post(gateway.url + chat, json=ok)),
            (401, c.post(gateway.url + chat, json=ok, headers={"authorization": "Bearer sk-sy-wrong"})),
            (400, c.post(gateway.url + chat, content=b"{nope", headers=gateway.headers())),
            (
                400,
                c.post(gateway.url + chat, json={"model": "auto", "messages": []}, headers=gateway.headers()),
            ),
            (400, c.post(gateway.url + chat, json={**ok, "temperature": 5}, headers=gateway.headers())),
            (404, c.post(gateway.url + chat, json={**ok, "model": "nope"}, headers=gateway.headers())),
            (
                403,
                c.post(
                    gateway.url + chat, json={**ok, "model": "restricted"}, headers=gateway.headers("team-b")
                ),
            ),
            (404, c.get(gateway.url + "/v1/nowhere", headers=gateway.headers())),
            (404, c.get(gateway.url + "/v1/models/nope", headers=gateway.headers())),
            (405, c.get(gateway.url + chat, headers=gateway.headers())),
            (403, c.post(gateway.url + "/admin/policy/reload", headers=gateway.headers())),
            (400, c.post(gateway.url + "/v1/responses", json={"model": "small"}, headers=gateway.headers())),
        ]
        mock.add_fault(kind="status", status=500, times=4)
        cases.append((502, c.post(gateway.url + chat, json=ok, headers=gateway.headers())))
        mock.add_fault(kind="status", status=400, message="bad thing")
        cases.append((400, c.post(gateway.url + chat, json=ok, headers=gateway.headers())))
        gateway.write_policy("routes: [not, a, mapping]\n")
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        cases.append((422, c.post(gateway.url + "/admin/policy/reload", headers=admin)))
        for _ in range(6):
            last = c.post(gateway.url + chat, json=ok, headers=gateway.headers("team-b"))
        cases.append((429, last))
    for status, r in cases:
        assert r.status_code == status, (status, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert "Traceback" not in r.text
        conforms(OpenAIError, r.json())


def test_mid_stream_failure_event_is_an_error_response(gateway: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=3)
    *chunks, last = chat_stream(gateway, {"model": "auto", "messages": HELLO, "stream": True})
    chunks_conform(chunks)
    assert "error" in last and "choices" not in last
    conforms(OpenAIError, last)


# --------------------------------------------------------------------------- the validator can fail
GOOD_CHUNK: dict[str, Any] = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}],
}
GOOD_MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}
GOOD_RESPONSE: dict[str, Any] = {
    "id": "r",
    "object": "response",
    "created_at": 1,
    "model": "m",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
GOOD_ERROR = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}}


def _with(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with ``path`` ("a.0.b") set to ``value`` (``...``: removed)."""
    out = json.loads(json.dumps(doc))
    *parents, last = path.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return out


BAD_BODIES = [
    ("chunk: wrong object", ChatCompletionChunk, _with(GOOD_CHUNK, "object", "chat.completion")),
    ("chunk: bad enum", ChatCompletionChunk, _with(GOOD_CHUNK, "choices.0.finish_reason", "bogus")),
    ("chunk: missing id", ChatCompletionChunk, _with(GOOD_CHUNK, "id", ...)),
    ("chunk: string for int", ChatCompletionChunk, _with(GOOD_CHUNK, "created", "1")),
    ("chunk: unknown field", ChatCompletionChunk, _with(GOOD_CHUNK, "x_extra", 1)),
    ("chunk: unknown nested field", ChatCompletionChunk, _with(GOOD_CHUNK, "choices.0.delta.thought", "t")),
    ("chunk: finish_reason absent", ChatCompletionChunk, _with(GOOD_CHUNK, "choices.0.finish_reason", ...)),
    ("error: param absent", OpenAIError, _with(GOOD_ERROR, "error.param", ...)),
    ("error: extra envelope key", OpenAIError, {**GOOD_ERROR, "detail": "x"}),
    ("error: message not a string", OpenAIError, _with(GOOD_ERROR, "error.message", 3)),
    ("models: wrong object", ModelList, {"object": "page", "data": []}),
    ("message: bad stop_reason", Message, _with(GOOD_MESSAGE, "stop_reason", "done")),
    ("message: unknown block field", Message, _with(GOOD_MESSAGE, "content.0.extra", 1)),
    ("message: no usage", Message, _with(GOOD_MESSAGE, "usage", ...)),
    (
        "event: unknown type",
        RawMessageStreamEvent,
        {"type": "message_pause", "message": GOOD_MESSAGE},
    ),
    (
        "event: delta missing",
        RawMessageStreamEvent,
        {"type": "content_block_delta", "index": 0},
    ),
    ("count: float", MessageTokensCount, {"input_tokens": 1.5}),
    ("ping: extra field", AnthropicPing, {"type": "ping", "at": 1}),
    ("response: unknown field", Response, {**GOOD_RESPONSE, "x": 1}),
    ("response: bad status", Response, {**GOOD_RESPONSE, "status": "done"}),
    (
        "anthropic error: bad type",
        AnthropicError,
        {"type": "error", "error": {"type": "oops", "message": "m"}},
    ),
    ("response event: unknown", ResponseStreamEvent, {"type": "response.nope", "sequence_number": 0}),
]


def test_validator_accepts_good_bodies() -> None:
    conforms(ChatCompletionChunk, GOOD_CHUNK)  # nulls allowed where the spec says nullable
    conforms(OpenAIError, GOOD_ERROR)
    conforms(Message, GOOD_MESSAGE)
    conforms(RawMessageStreamEvent, {"type": "message_stop"})
    conforms(Response, GOOD_RESPONSE)
    conforms(
        ModelList, {"object": "list", "data": [{"id": "a", "object": "model", "created": 1, "owned_by": "x"}]}
    )


@pytest.mark.parametrize(
    ("kind", "body"), [(k, b) for _, k, b in BAD_BODIES], ids=[n for n, _, _ in BAD_BODIES]
)
def test_validator_rejects_bad_bodies(kind: Any, body: Any) -> None:
    """Guard against a vacuous validator: each deliberately wrong body is refused."""
    with pytest.raises(NotConformant):
        conforms(kind, body)
