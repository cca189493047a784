"""Wire conformance: what the gateway sends validates against OpenAI's published OpenAPI spec.

Raw HTTP (httpx2, no SDK parsing that could paper over shape problems) against the real
gateway and the mock upstream; every JSON body and every SSE chunk is validated with
``jsonschema`` against the spec's component schemas (``$ref``s resolved by ``referencing``).

The spec is a 3 MB file kept outside the repository (``../shared/specs``); the tests skip
when it is absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import pytest
import referencing
import yaml
from referencing.jsonschema import DRAFT202012

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway

SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "specs" / "openai-openapi.yaml"
SPEC_URI = "urn:openai-openapi"
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

Validate = Callable[[str, Any], None]


def _allow_null(node: Any, *, schema_map: bool = False) -> Any:
    """Rewrite OpenAPI 3.0 ``nullable: true`` as a JSON Schema null alternative.

    The spec declares ``openapi: 3.1`` (JSON Schema 2020-12, nulls as ``type: "null"``) but
    still carries 3.0-style ``nullable: true`` in places; plain JSON Schema ignores that
    keyword, so without this rewrite a spec-legal ``null`` (e.g. ``finish_reason`` or
    ``usage`` in stream chunks) would be rejected. ``schema_map`` marks a mapping of names to
    schemas (``properties``, ``components.schemas``), which is not a schema itself."""
    if isinstance(node, list):
        return [_allow_null(v) for v in node]
    if not isinstance(node, dict):
        return node
    if schema_map:
        return {k: _allow_null(v) for k, v in node.items()}
    out = {
        k: _allow_null(
            v, schema_map=k in ("properties", "patternProperties", "$defs", "schemas", "definitions")
        )
        for k, v in node.items()
    }
    if out.get("nullable") is True:
        del out["nullable"]
        return {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture(scope="module")
def validate() -> Validate:
    """Load the spec once for this module; returns ``validate(schema_name, instance)``."""
    if not SPEC_PATH.is_file():
        pytest.skip(f"OpenAI OpenAPI spec not found at {SPEC_PATH}; conformance tests need it")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with SPEC_PATH.open("rb") as f:
        spec = yaml.load(f, Loader=loader)
    version = str(spec.get("openapi", ""))
    assert version.startswith(("3.0", "3.1")), f"unexpected OpenAPI version {version!r}"
    spec = _allow_null(spec)  # needed for 3.0, and for the 3.0 leftovers in 3.1 files
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        SPEC_URI, DRAFT202012.create_resource(spec)
    )
    validators: dict[str, jsonschema.Draft202012Validator] = {}

    def check(name: str, instance: Any) -> None:
        assert name in spec["components"]["schemas"], f"no schema {name} in the spec"
        if name not in validators:
            ref = {"$ref": f"{SPEC_URI}#/components/schemas/{name}"}
            validators[name] = jsonschema.Draft202012Validator(ref, registry=registry)
        errors = sorted(validators[name].iter_errors(instance), key=lambda e: list(e.absolute_path))
        assert not errors, (
            f"{name} violations:\n"
            + "\n".join(
                f"  at {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors[:10]
            )
            + f"\ninstance: {json.dumps(instance)[:2000]}"
        )

    return check


def post(gateway: RunningGateway, path: str, body: Any, **kw: Any) -> httpx.Response:
    r = gateway.post(path, body, **kw)
    assert "Traceback" not in r.text
    return r


def stream_events(gateway: RunningGateway, body: dict[str, Any], tenant: str = "team-a") -> list[Any]:
    """POST a streaming chat request; return every ``data:`` payload, parsed, up to [DONE]."""
    events: list[Any] = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", gateway.base_url + "/chat/completions", json=body, headers=gateway.headers(tenant)
        ) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        done = False
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), f"unexpected SSE line {line!r}"
            assert not done, "data after [DONE]"
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            events.append(json.loads(payload))
    assert done or any("error" in e for e in events), "stream ended without [DONE]"
    return events


# --------------------------------------------------------------------------- chat


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_chat_completion_response(
    gateway: RunningGateway, validate: Validate, route: str, tools: bool
) -> None:
    body: dict[str, Any] = {"model": route, "messages": HELLO}
    if tools:
        body["tools"] = TOOLS
    r = post(gateway, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    data = r.json()
    validate("CreateChatCompletionResponse", data)
    assert data["choices"][0]["finish_reason"] == ("tool_calls" if tools else "stop")


def test_chat_completion_response_with_n(gateway: RunningGateway, validate: Validate) -> None:
    r = post(gateway, "/v1/chat/completions", {"model": "auto", "messages": HELLO, "n": 2, "stop": "pad"})
    validate("CreateChatCompletionResponse", r.json())
    assert len(r.json()["choices"]) == 2


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
@pytest.mark.parametrize("include_usage", [False, True], ids=["no-usage", "usage"])
def test_stream_chunks(
    gateway: RunningGateway, validate: Validate, route: str, tools: bool, include_usage: bool
) -> None:
    body: dict[str, Any] = {"model": route, "messages": HELLO, "stream": True}
    if tools:
        body["tools"] = TOOLS
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    chunks = stream_events(gateway, body)
    assert len(chunks) >= 3
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert usage_chunks == [chunks[-1]] and chunks[-1]["choices"] == []
    else:
        assert usage_chunks == []
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["tool_calls" if tools else "stop"]


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tools"])
def test_cache_hit_replays_validate(gateway: RunningGateway, validate: Validate, tools: bool) -> None:
    body: dict[str, Any] = {"model": "auto", "messages": HELLO, "temperature": 0}
    if tools:
        body["tools"] = TOOLS
    first = post(gateway, "/v1/chat/completions", body)
    assert first.headers["x-switchyard-cache"] == "miss"
    hit = post(gateway, "/v1/chat/completions", body)
    assert hit.headers["x-switchyard-cache"] == "hit"
    validate("CreateChatCompletionResponse", hit.json())
    for include_usage in (False, True):
        chunks = stream_events(
            gateway, {**body, "stream": True, "stream_options": {"include_usage": include_usage}}
        )
        for chunk in chunks:
            validate("CreateChatCompletionStreamResponse", chunk)
        assert bool(chunks[-1].get("usage")) is include_usage


def test_cache_hit_of_a_streamed_answer_validates(gateway: RunningGateway, validate: Validate) -> None:
    body: dict[str, Any] = {"model": "anthropic-first", "messages": HELLO, "temperature": 0, "stream": True}
    stream_events(gateway, body)  # fills the cache from an assembled stream
    hit = post(gateway, "/v1/chat/completions", {**body, "stream": False})
    assert hit.headers["x-switchyard-cache"] == "hit"
    validate("CreateChatCompletionResponse", hit.json())
    for chunk in stream_events(gateway, body):
        validate("CreateChatCompletionStreamResponse", chunk)


# --------------------------------------------------------------------------- other endpoints


def test_models_list(gateway: RunningGateway, validate: Validate) -> None:
    r = gateway.get("/v1/models", headers=gateway.headers())
    assert r.status_code == 200
    validate("ListModelsResponse", r.json())
    assert {m["id"] for m in r.json()["data"]} >= {"auto", "small", "claude"}


def test_embeddings(gateway: RunningGateway, validate: Validate) -> None:
    r = post(gateway, "/v1/embeddings", {"model": "embed", "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    validate("CreateEmbeddingResponse", r.json())


def test_completions(gateway: RunningGateway, validate: Validate) -> None:
    r = post(gateway, "/v1/completions", {"model": "legacy", "prompt": "hi"})
    assert r.status_code == 200, r.text
    validate("CreateCompletionResponse", r.json())


# --------------------------------------------------------------------------- errors


def test_error_bodies(gateway: RunningGateway, mock: MockUpstream, validate: Validate) -> None:
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
            (405, c.get(gateway.url + chat, headers=gateway.headers())),
            (403, c.post(gateway.url + "/admin/policy/reload", headers=gateway.headers())),
        ]
        mock.add_fault(kind="status", status=500, times=4)
        cases.append((502, c.post(gateway.url + chat, json=ok, headers=gateway.headers())))
        mock.add_fault(kind="status", status=400, message="bad thing")
        cases.append((400, c.post(gateway.url + chat, json=ok, headers=gateway.headers())))
        gateway.write_policy("routes: [not, a, mapping]\n")
        cases.append(
            (
                422,
                c.post(
                    gateway.url + "/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"}
                ),
            )
        )
        for _ in range(6):
            last = c.post(gateway.url + chat, json=ok, headers=gateway.headers("team-b"))
        cases.append((429, last))
    for status, r in cases:
        assert r.status_code == status, (status, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert "Traceback" not in r.text
        validate("ErrorResponse", r.json())


def test_mid_stream_failure_event_is_an_error_response(
    gateway: RunningGateway, mock: MockUpstream, validate: Validate
) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=3)
    events = stream_events(gateway, {"model": "auto", "messages": HELLO, "stream": True})
    *chunks, last = events
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert "error" in last and "choices" not in last
    validate("ErrorResponse", last)


def test_the_validator_can_fail(validate: Validate) -> None:
    """Guard against a vacuous validator (e.g. a ``$ref`` that resolves to ``{}``)."""
    good = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}],
        "usage": None,
    }
    validate("CreateChatCompletionStreamResponse", good)  # nulls allowed where the spec says nullable
    bad_chunks = [
        {**good, "object": "chat.completion"},
        {**good, "choices": [{"index": 0, "delta": {}, "finish_reason": "bogus"}]},
        {k: v for k, v in good.items() if k != "id"},
    ]
    for bad in bad_chunks:
        with pytest.raises(AssertionError):
            validate("CreateChatCompletionStreamResponse", bad)
    with pytest.raises(AssertionError):
        validate("ErrorResponse", {"error": {"message": "m", "type": "t"}})
