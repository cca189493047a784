"""Caches on ``/v1/messages``: a streamed answer (passed through from Anthropic, or translated
from a chat upstream) is put back together and stored in the exact cache, then replayed as
JSON or as events the SDK reads; the semantic cache answers paraphrases on Messages, and its
entries carry the protocol, so chat and Messages never share an answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.protocols.anthropic_assemble import MessageAssembler
from gateway.protocols.anthropic_events import message_frames
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

EVENTS = TypeAdapter(RawMessageStreamEvent)
HELLO = [{"role": "user", "content": "hello there"}]
FAQ = "  faq:\n    targets: [claude]\n    semantic_cache: {enabled: true, ttl_s: 600, threshold: 0.9}\n"


@pytest.fixture
def gw(request: pytest.FixtureRequest, tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    policy = mock_policy(mock.base_url)
    if "semantic" in request.node.name:  # only there: the embedder loads at start-up
        policy = policy.replace("routes:\n", "routes:\n" + FAQ, 1)
    gateway = start_gateway(tmp_path, policy)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def client(gw: RunningGateway) -> Iterator[anthropic.Anthropic]:
    c = anthropic.Anthropic(base_url=gw.url, api_key=gw.key(), max_retries=0, timeout=60)
    yield c
    c.close()


def sdk(body: dict[str, Any]) -> Any:
    """SDK keyword arguments for a body (temperature as an extra: this SDK's stream() has none)."""
    kw = {k: v for k, v in body.items() if k != "temperature"}
    return {**kw, "extra_body": {"temperature": body["temperature"]}} if "temperature" in body else kw


def upstream_calls(mock: MockUpstream) -> int:
    return len([r for r in mock.requests() if r["path"].endswith(("/v1/messages", "/chat/completions"))])


def stream_events(gw: RunningGateway, body: dict[str, Any]) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    with httpx.stream(
        "POST", gw.url + "/v1/messages", json={**body, "stream": True}, headers={"x-api-key": gw.key()}
    ) as r:
        assert r.status_code == 200
        data = [orjson.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        return r.headers, data


@pytest.mark.parametrize("model", ["claude", "small"])  # passed through; translated from chat
def test_a_streamed_answer_is_stored_and_replayed(
    client: anthropic.Anthropic, gw: RunningGateway, mock: MockUpstream, model: str
) -> None:
    body = {"model": model, "max_tokens": 20, "messages": HELLO, "temperature": 0}
    with client.messages.stream(**sdk(body)) as stream:
        text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    raw = client.messages.with_raw_response.create(**sdk(body))
    assert raw.headers["x-switchyard-cache"] == "hit"
    again = Message.model_validate(raw.http_response.json())
    assert again.content[0].type == "text" and again.content[0].text == text
    assert (
        again.stop_reason == streamed.stop_reason
        and again.usage.output_tokens == streamed.usage.output_tokens
    )
    headers, events = stream_events(gw, body)
    assert headers["x-switchyard-cache"] == "hit"
    parsed = [EVENTS.validate_python(e) for e in events]
    assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
    assert (
        "".join(
            e.delta.text for e in parsed if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )
        == text
    )
    assert upstream_calls(mock) == 1
    statuses = [r["cache_status"] for r in gw.ledger_rows() if r["endpoint"] == "messages"]
    assert statuses == ["miss", "hit", "hit"]


def test_a_streamed_tool_call_is_stored_whole(client: anthropic.Anthropic, mock: MockUpstream) -> None:
    tool = {"name": "lookup", "description": "d", "input_schema": {"type": "object", "properties": {}}}
    body = {"model": "claude", "max_tokens": 20, "messages": HELLO, "temperature": 0, "tools": [tool]}
    with client.messages.stream(**sdk(body)) as stream:
        streamed = stream.get_final_message()
    again = client.messages.create(**sdk(body))
    assert upstream_calls(mock) == 1
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in streamed.content]
    assert again.content[-1].type == "tool_use" and again.stop_reason == "tool_use"


def test_the_assembler_puts_every_block_kind_back() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "thinking", "thinking": "Let me see…", "signature": "EqQBCkYIARgCIkD+/=="},
            {"type": "redacted_thinking", "data": "opaque=="},
            {"type": "text", "text": "Hi — there"},
            {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": [1, "é"]}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 7},
    }
    assembler = MessageAssembler()
    for f in message_frames(message):
        assembler.add(orjson.loads(f.split(b"\ndata: ", 1)[1]))
    assert assembler.result() == message
    broken = MessageAssembler()
    broken.add({"type": "message_start", "message": {**message, "content": []}})
    broken.add(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "input": {}}}
    )
    broken.add(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"a"'},
        }
    )
    assert broken.result() is None  # never stored half


def test_semantic_cache_on_messages_and_no_cross_protocol(
    client: anthropic.Anthropic, gw: RunningGateway, mock: MockUpstream
) -> None:
    def ask(text: str) -> Any:
        body = {
            "model": "faq",
            "max_tokens": 20,
            "temperature": 0,
            "messages": [{"role": "user", "content": text}],
        }
        return client.messages.with_raw_response.create(**sdk(body))

    first = ask("How can I reset my password?")
    assert first.headers["x-switchyard-cache"] == "miss"
    answer = first.parse().content[0].text
    second = ask("How do I reset my password?")
    assert second.headers["x-switchyard-cache"] == "semantic"
    assert Message.model_validate(second.http_response.json()).content[0].text == answer  # type: ignore[union-attr]
    assert upstream_calls(mock) == 1
    # the same question over chat, on the same route: a chat answer, never the Messages one
    chat = openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0, timeout=60)
    try:
        raw = chat.chat.completions.with_raw_response.create(
            model="faq",
            temperature=0,
            max_tokens=20,
            messages=[{"role": "user", "content": "How do I reset my password?"}],
        )
        assert raw.headers["x-switchyard-cache"] == "miss" and raw.parse().choices[0].message.content
        assert upstream_calls(mock) == 2
        # and the other way: chat's entry is not a Messages answer
        raw = chat.chat.completions.with_raw_response.create(
            model="faq",
            temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert raw.headers["x-switchyard-cache"] == "miss"
    finally:
        chat.close()
    third = ask("What's the capital of France?")
    assert third.headers["x-switchyard-cache"] == "miss" and third.parse().type == "message"
    assert upstream_calls(mock) == 4
