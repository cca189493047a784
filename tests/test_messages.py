"""Anthropic Messages in (``/v1/messages``) through a real gateway, with the official
``anthropic`` SDK: pass-through to an Anthropic upstream (body and events as they are) and
translation to a chat-completions upstream, streaming, tools, count_tokens, errors, the
ledger rows and costs, and glob aliases for the model names agents send."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

ALIASES = """
aliases:
  "claude-*": anthropic-first
  "gpt-5*-codex": auto
"""
HELLO = [{"role": "user", "content": "hello there"}]
EVENTS = TypeAdapter(RawMessageStreamEvent)


OPEN: list[anthropic.Anthropic] = []  # SDK clients of the running test, closed at its end


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, mock_policy(mock.base_url, ALIASES))
    try:
        yield gateway
    finally:
        while OPEN:
            OPEN.pop().close()
        gateway.stop()


def client(gw: RunningGateway, api_key: str | None = None) -> anthropic.Anthropic:
    c = anthropic.Anthropic(base_url=gw.url, api_key=api_key or gw.key(), max_retries=0)
    OPEN.append(c)
    return c


def rows(gw: RunningGateway) -> list[dict[str, Any]]:
    return [r for r in gw.ledger_rows() if r["endpoint"] == "messages"]


def upstream_bodies(mock: MockUpstream, path: str) -> list[dict[str, Any]]:
    return [r["body"] for r in mock.requests() if r["path"].endswith(path)]


def test_pass_through_to_an_anthropic_upstream(gw: RunningGateway, mock: MockUpstream) -> None:
    msg = client(gw).messages.create(model="claude-opus-5-5", max_tokens=20, messages=HELLO)
    assert isinstance(msg, Message) and msg.content[0].type == "text" and msg.content[0].text
    assert msg.usage.output_tokens > 0
    (row,) = rows(gw)
    assert row["route"] == "anthropic-first" and row["provider"] == "mock-anthropic"
    assert row["requested_model"] == "claude-opus-5-5" and row["status"] == "ok"
    assert Decimal(row["cost_usd"]) > 0
    (sent,) = upstream_bodies(mock, "/v1/messages")
    assert sent["model"] == "claude-mock" and sent["messages"] == HELLO  # only the model replaced


def test_pass_through_keeps_thinking_signatures_and_unknown_fields(
    gw: RunningGateway, mock: MockUpstream
) -> None:
    history = [
        {"role": "user", "content": "think first"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Let me see…", "signature": "EqQBCkYIARgCIkD+/=="},
                {"type": "text", "text": "Done.", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "user", "content": "and now?"},
    ]
    body = {"model": "claude-x", "max_tokens": 16, "messages": history, "future_field": {"a": [1, 2]}}
    r = httpx.post(
        gw.url + "/v1/messages?beta=true",
        json=body,
        headers={"x-api-key": gw.key(), "anthropic-version": "2023-06-01", "anthropic-beta": "b1,b2"},
    )
    assert r.status_code == 200, r.text
    (req,) = [q for q in mock.requests() if q["path"].endswith("/v1/messages")]
    assert req["body"] == {**body, "model": "claude-mock"}
    assert req["headers"].get("anthropic-beta") == "b1,b2"


def test_streaming_pass_through_with_the_sdk(gw: RunningGateway) -> None:
    with client(gw).messages.stream(model="claude-sonnet", max_tokens=20, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    (row,) = rows(gw)
    assert row["stream"] == 1 and row["status"] == "ok" and row["output_tokens"] == final.usage.output_tokens


def test_translated_to_a_chat_upstream_stream_and_not(gw: RunningGateway) -> None:
    c = client(gw)
    msg = c.messages.create(model="small", max_tokens=20, messages=HELLO, system="be brief")
    assert msg.content[0].type == "text" and msg.stop_reason in ("end_turn", "max_tokens")
    with c.messages.stream(model="small", max_tokens=20, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text  # type: ignore[union-attr]
    assert [r["provider"] for r in rows(gw)] == ["mock", "mock"]
    assert all(Decimal(r["cost_usd"]) > 0 for r in rows(gw))


def test_every_translated_event_is_an_sdk_event(gw: RunningGateway) -> None:
    body = {"model": "small", "max_tokens": 20, "messages": HELLO, "stream": True}
    with httpx.stream("POST", gw.url + "/v1/messages", json=body, headers={"x-api-key": gw.key()}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [EVENTS.validate_json(line[6:]).type for line in lines]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds


@pytest.mark.parametrize("model", ["claude-haiku", "small"])
def test_tool_use_and_tool_result_round_trip(gw: RunningGateway, model: str) -> None:
    tools = [{"name": "lookup", "description": "look it up",
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]  # fmt: skip
    c = client(gw)
    first = c.messages.create(model=model, max_tokens=50, messages=HELLO, tools=tools)  # type: ignore[arg-type]
    use = next(b for b in first.content if b.type == "tool_use")
    assert first.stop_reason == "tool_use" and use.name == "lookup"
    turn = [
        *HELLO,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
    ]
    second = c.messages.create(model=model, max_tokens=20, messages=turn)  # type: ignore[arg-type]
    assert second.content and second.content[0].type == "text"


async def test_async_client_and_count_tokens(gw: RunningGateway) -> None:
    c = anthropic.AsyncAnthropic(base_url=gw.url, api_key=gw.key(), max_retries=0)
    msg = await c.messages.create(model="claude-x", max_tokens=10, messages=HELLO)
    assert msg.content
    count = await c.messages.count_tokens(model="claude-x", messages=HELLO, system="be brief")
    assert 3 <= count.input_tokens <= 20
    await c.close()


def test_count_tokens_is_the_upstreams_when_it_is_anthropic_else_an_estimate_said_so(
    gw: RunningGateway, mock: MockUpstream
) -> None:
    body = {"model": "claude-x", "system": "be brief", "messages": HELLO}
    exact = httpx.post(gw.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": gw.key(),
                       "anthropic-version": "2023-06-01"})  # fmt: skip
    assert exact.status_code == 200 and exact.headers["x-switchyard-token-count"] == "exact"
    (sent,) = upstream_bodies(mock, "/v1/messages/count_tokens")
    assert sent["model"] == "claude-mock" and sent["system"] == "be brief"
    assert exact.json()["input_tokens"] == 4  # the mock's word count: "be brief" + "hello there"
    local = httpx.post(gw.url + "/v1/messages/count_tokens", json={**body, "model": "small"},
                       headers={"x-api-key": gw.key()})  # fmt: skip
    assert local.status_code == 200 and local.headers["x-switchyard-token-count"] == "estimate"
    assert 3 <= local.json()["input_tokens"] <= 20
    assert len(upstream_bodies(mock, "/v1/messages/count_tokens")) == 1  # the chat route counted locally


def test_errors_are_anthropic_shaped(gw: RunningGateway) -> None:
    c = client(gw)
    with pytest.raises(anthropic.NotFoundError) as nf:
        c.messages.create(model="no-such-model", max_tokens=10, messages=HELLO)
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        client(gw, "sk-sy-wrong").messages.create(model="claude-x", max_tokens=10, messages=HELLO)
    r = httpx.post(
        gw.url + "/v1/messages",
        json={"model": "claude-x", "messages": HELLO},
        headers={"x-api-key": gw.key()},
    )
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    doc = [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]
    r = httpx.post(gw.url + "/v1/messages", json={"model": "small", "max_tokens": 5, "messages": doc},
                   headers={"x-api-key": gw.key()})  # fmt: skip
    assert r.status_code == 400 and "messages[0].content[0]" in r.json()["error"]["message"]


def test_cache_reads_and_writes_are_priced(gw: RunningGateway) -> None:
    system = [{"type": "text", "text": "stable system prompt " * 50, "cache_control": {"type": "ephemeral"}}]
    c = client(gw)
    for _ in range(2):
        c.messages.create(model="claude-x", max_tokens=10, system=system, messages=HELLO)  # type: ignore[arg-type]
    write, read = rows(gw)
    assert write["cache_write_tokens"] > 0 and not write["cached_tokens"]
    assert read["cached_tokens"] == write["cache_write_tokens"]
    assert Decimal(read["cost_usd"]) < Decimal(write["cost_usd"])  # a read costs 0.1x, a write 1.25x


def test_streamed_and_not_cost_the_same(gw: RunningGateway) -> None:
    c = client(gw)
    for model in ("claude-x", "small"):
        c.messages.create(model=model, max_tokens=20, messages=HELLO)
        with c.messages.stream(model=model, max_tokens=20, messages=HELLO) as s:
            s.get_final_message()
    costs = [Decimal(r["cost_usd"]) for r in rows(gw)]
    assert costs[0] == costs[1] and costs[2] == costs[3]


def test_an_alias_to_nothing_is_a_policy_error(tmp_path: Path) -> None:
    from gateway.config.loader import PolicyError, load_policy

    path = tmp_path / "p.yaml"
    path.write_text(mock_policy("http://127.0.0.1:9", 'aliases:\n  "claude-*": nowhere\n'))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert ("aliases.claude-*", "unknown route or model 'nowhere'") in err.value.problems


def test_golden_costs_for_each_outbound(gw: RunningGateway) -> None:
    """Messages -> Anthropic (with a cache write, then a read) and Messages -> chat, priced to
    the 1e-10 USD from the catalog of tests/gateway_harness.py (per 1M tokens)."""
    system = [{"type": "text", "text": "stable system prompt " * 50, "cache_control": {"type": "ephemeral"}}]
    c = client(gw)
    for _ in range(2):
        c.messages.create(model="claude-x", max_tokens=10, system=system, messages=HELLO)  # type: ignore[arg-type]
    c.messages.create(model="small", max_tokens=10, messages=HELLO)
    million = Decimal(1_000_000)
    for row in rows(gw):
        inp, out = row["input_tokens"], row["output_tokens"]
        read, write = row["cached_tokens"] or 0, row["cache_write_tokens"] or 0
        if row["provider"] == "mock-anthropic":  # input 3, cached 0.30, write 3.75, output 15
            expected = (Decimal(inp - read - write) * 3 + Decimal(read) * Decimal("0.30")
                        + Decimal(write) * Decimal("3.75") + Decimal(out) * 15) / million  # fmt: skip
        else:  # small: input 0.15, output 0.60
            expected = (Decimal(inp) * Decimal("0.15") + Decimal(out) * Decimal("0.60")) / million
        assert Decimal(row["cost_usd"]) == expected.quantize(Decimal("1E-10")), row
