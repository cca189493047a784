"""The OpenAI Responses API through a real gateway on loopback, driven by the official
``openai`` SDK: create (text, instructions, tools and a function_call_output round trip,
previous_response_id, streaming with the SDK's stream helper), retrieve, delete,
input_items; every response and stream event validated against the SDK's own models;
ledger rows and costs; OpenAI-shaped errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


Client = Callable[..., openai.OpenAI]


@pytest.fixture
def client() -> Iterator[Client]:
    """An SDK client for a tenant of the gateway; every one is closed after the test."""
    made: list[openai.OpenAI] = []

    def make(gw: RunningGateway, tenant: str = "team-a") -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=gw.base_url, api_key=gw.key(tenant), max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def strict(raw: dict[str, Any]) -> Response:
    """Validate a Response body with the SDK's pydantic model (not the lenient construct)."""
    return Response.model_validate(raw)


def chat_sent(mock: MockUpstream) -> dict[str, Any]:
    reqs = [r for r in mock.requests() if r.get("path", "").endswith("/chat/completions")]
    body: dict[str, Any] = reqs[-1]["body"]
    return body


def test_text_response_validates_and_is_metered(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    c = client(gateway)
    raw = c.responses.with_raw_response.create(model="small", input="hello there", instructions="Be brief.")
    resp = strict(raw.http_response.json())
    assert resp.status == "completed" and resp.object == "response"
    assert resp.output_text and resp.output[0].type == "message"
    assert resp.usage is not None and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.input_tokens_details.cached_tokens == 0
    sent = chat_sent(mock)
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["messages"][1] == {"role": "user", "content": "hello there"}
    rows = gateway.ledger_rows()
    assert len(rows) == 1
    row = rows[0]
    assert row["endpoint"] == "responses" and row["status"] == "ok" and row["served_model"] == "small"
    assert row["input_tokens"] == resp.usage.input_tokens and row["output_tokens"] == resp.usage.output_tokens
    expected = (
        Decimal(resp.usage.input_tokens) * Decimal("0.15")
        + Decimal(resp.usage.output_tokens) * Decimal("0.60")
    ) / Decimal(10**6)
    assert Decimal(str(row["cost_usd"])) == pytest.approx(expected)
    assert raw.headers["x-switchyard-route"] == "small" or raw.headers["x-switchyard-model"] == "small"


def test_parameters_translate_to_chat(client: Client, gateway: RunningGateway, mock: MockUpstream) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    client(gateway).responses.create(
        model="small",
        input=[
            {"role": "developer", "content": "rules"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this"},
                    {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                ],
            },
        ],
        max_output_tokens=50,
        temperature=0.5,
        top_p=0.9,
        reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
    )
    sent = chat_sent(mock)
    assert sent["max_tokens"] == 50 and sent["temperature"] == 0.5 and sent["top_p"] == 0.9
    assert sent["reasoning_effort"] == "low"
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert sent["messages"][0] == {"role": "system", "content": "rules"}
    assert sent["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://example.com/a.png", "detail": "low"},
    }


def test_tool_call_round_trip(client: Client, gateway: RunningGateway, mock: MockUpstream) -> None:
    c = client(gateway)
    raw = c.responses.with_raw_response.create(model="small", input="weather in Paris?", tools=[TOOL])
    first = strict(raw.http_response.json())
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert chat_sent(mock)["tools"][0]["function"]["name"] == "get_weather"
    second = c.responses.create(
        model="small",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"}],
        tools=[TOOL],
        tool_choice="none",
    )
    assert second.output_text and second.previous_response_id == first.id
    msgs = chat_sent(mock)["messages"]
    assert msgs[0] == {"role": "user", "content": "weather in Paris?"}
    assert msgs[1]["role"] == "assistant" and msgs[1]["tool_calls"][0]["id"] == calls[0].call_id
    assert msgs[2] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny, 21C"}
    assert chat_sent(mock)["tool_choice"] == "none"


def test_previous_response_id_continues_the_conversation(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    c = client(gateway)
    one = c.responses.create(model="small", input="first question", instructions="sys")
    two = c.responses.create(
        model="small", input="second question", previous_response_id=one.id, instructions="sys"
    )
    msgs = chat_sent(mock)["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == one.output_text and msgs[3]["content"] == "second question"
    got = c.responses.retrieve(two.id)
    assert got.id == two.id and got.output_text == two.output_text
    strict(gateway.get(f"/v1/responses/{two.id}", headers=gateway.headers()).json())
    items = gateway.get(f"/v1/responses/{two.id}/input_items", headers=gateway.headers()).json()
    page = ResponseItemList.model_validate(items)
    assert [i.type for i in page.data] == ["message"] and page.first_id == page.last_id
    listed = c.responses.input_items.list(one.id)
    assert [i.type for i in listed.data] == ["message"]


def test_other_tenant_sees_not_found_and_delete(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    resp = c.responses.create(model="small", input="private")
    with pytest.raises(openai.NotFoundError) as err:
        client(gateway, "team-b").responses.retrieve(resp.id)
    assert err.value.body["code"] == "response_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(gateway, "team-b").responses.create(model="small", input="x", previous_response_id=resp.id)
    c.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(resp.id)


def test_store_false_keeps_nothing(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    resp = c.responses.create(model="small", input="ephemeral", store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(resp.id)


def test_untranslatable_fields_are_400_naming_the_field(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="small", input="x", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0].type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="small", input=[{"type": "item_reference", "id": "x"}])
    assert err.value.body["param"] == "input[0].type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="small", input="x", background=True)
    assert err.value.body["param"] == "background"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model="small", input="x", max_output_tokens=0)
    assert err.value.body["param"] == "max_output_tokens"  # type: ignore[index]
    rows = gateway.ledger_rows()  # refused at the door: a row each, with its error code, nothing served
    assert [(r["http_status"], r["error_code"], r["served_model"]) for r in rows] == [
        (400, "invalid_request_error", None)
    ] * 4


def test_stream_events_validate_and_meter(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    seen: list[str] = []
    with c.responses.stream(model="small", input="stream please") as stream:
        for event in stream:
            seen.append(event.type)
        final = stream.get_final_response()
    assert seen[:2] == ["response.created", "response.in_progress"]
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert kind in seen
    assert seen[-1] == "response.completed"
    assert final.output_text and final.usage is not None and final.usage.output_tokens > 0
    row = gateway.ledger_rows()[-1]
    assert (
        row["endpoint"] == "responses"
        and row["stream"] == 1
        and row["output_tokens"] == final.usage.output_tokens
    )
    assert c.responses.retrieve(final.id).output_text == final.output_text


def _raw_events(gw: RunningGateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    import json

    events = []
    r = gw.post("/v1/responses", {**body, "stream": True})
    for block in r.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            data = json.loads(lines["data"])
            assert lines["event"] == data["type"]
            EVENTS.validate_python(data)
            events.append(data)
    return events


def test_stream_tool_call_events(client: Client, gateway: RunningGateway) -> None:
    events = _raw_events(gateway, {"model": "small", "input": "weather?", "tools": [TOOL]})
    kinds = [e["type"] for e in events]
    assert (
        "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    final = strict(events[-1]["response"])
    call = final.output[0]
    assert call.type == "function_call" and call.arguments == done["arguments"] and call.name == "get_weather"


def test_stream_cut_ends_with_an_error_event(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=2)
    events = _raw_events(gateway, {"model": "small", "input": "hello"})
    assert events[-1]["type"] == "error"
    assert "response.completed" not in [e["type"] for e in events]
    row = gateway.ledger_rows()[-1]
    assert row["endpoint"] == "responses" and row["status"] == "stream_broken"


def test_anthropic_upstream_through_the_chat_path(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    raw = c.responses.with_raw_response.create(
        model="anthropic-first", input="hello claude", instructions="sys"
    )
    resp = strict(raw.http_response.json())
    assert resp.output_text and raw.headers["x-switchyard-provider"] == "mock-anthropic"
    events = _raw_events(gateway, {"model": "anthropic-first", "input": "hello again"})
    assert events[-1]["type"] == "response.completed"
    final = strict(events[-1]["response"])
    rows = gateway.ledger_rows()
    assert [(r["served_model"], r["endpoint"], r["stream"]) for r in rows] == [
        ("claude", "responses", 0),
        ("claude", "responses", 1),
    ]
    assert rows[1]["output_tokens"] == final.usage.output_tokens  # type: ignore[union-attr]
    assert Decimal(str(rows[1]["cost_usd"])) > 0


def test_cache_hit_is_replayed_as_a_response(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    c = client(gateway)
    first = c.responses.create(model="small", input="cache me", temperature=0)
    second = c.responses.with_raw_response.create(model="small", input="cache me", temperature=0)
    again = strict(second.http_response.json())
    assert second.headers["x-switchyard-cache"] == "hit"
    assert again.output_text == first.output_text and again.id != first.id
    events = _raw_events(gateway, {"model": "small", "input": "cache me", "temperature": 0})
    assert events[-1]["type"] == "response.completed"
    assert strict(events[-1]["response"]).output_text == first.output_text
    rows = gateway.ledger_rows()
    assert [r["cache_status"] for r in rows] == ["miss", "hit", "hit"]
    assert all(Decimal(str(r["cost_usd"])) == 0 for r in rows[1:])
    assert len([r for r in mock.requests() if r.get("path", "").endswith("/chat/completions")]) == 1


def test_models_retrieve(client: Client, gateway: RunningGateway) -> None:
    c = client(gateway)
    assert c.models.retrieve("small").id == "small"
    assert c.models.retrieve("auto").owned_by == "switchyard"
    with pytest.raises(openai.NotFoundError) as err:
        c.models.retrieve("no-such-model")
    assert err.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client(gateway, "team-b").models.retrieve("large")  # exists, but not for team-b


def test_limits_budgets_and_aliases_apply(client: Client, tmp_path: Path, mock: MockUpstream) -> None:
    text = mock_policy(mock.base_url, '\naliases:\n  "gpt-5*": auto\n')
    text = text.replace("tenants:\n", "tenants:\n  capped:\n    budget: {daily_usd: 0.0005}\n", 1)
    gw = start_gateway(tmp_path, text)
    try:
        assert gw.app_state.services.responses.ttl_s == 30 * 24 * 3600  # the default TTL
        c = client(gw)
        resp = c.responses.create(model="gpt-5-mini", input="aliased", prompt_cache_key="conv-1")
        assert resp.model == "gpt-5-mini" and chat_sent(mock)["prompt_cache_key"] == "conv-1"
        assert c.models.retrieve("gpt-5-codex").id == "gpt-5-codex"
        with pytest.raises(openai.RateLimitError) as err:  # worst case 100k output tokens > budget
            client(gw, "capped").responses.create(model="small", input="x", max_output_tokens=100_000)
        assert "budget" in err.value.message
        b = client(gw, "team-b")  # rpm: 5
        for _ in range(5):
            b.responses.create(model="small", input="x", store=False)
        with pytest.raises(openai.RateLimitError):
            b.responses.create(model="small", input="x")
        rows = gw.ledger_rows()
        assert rows[0]["route"] == "auto" and rows[0]["requested_model"] == "gpt-5-mini"
        assert [r["http_status"] for r in rows[1:]] == [429, 200, 200, 200, 200, 200, 429]
        assert {r["endpoint"] for r in rows} == {"responses"}
    finally:
        gw.stop()


def test_reasoning_items_are_named_in_the_dropped_header(client: Client, gateway: RunningGateway) -> None:
    raw = client(gateway).responses.with_raw_response.create(
        model="small",
        input=[
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "user", "content": "q"},
        ],
    )
    assert raw.headers["x-switchyard-dropped"] == "reasoning"


@pytest.mark.parametrize("model", ["small", "anthropic-first"])
def test_streamed_and_not_streamed_cost_the_same(client: Client, gateway: RunningGateway, model: str) -> None:
    c = client(gateway)
    plain = c.responses.create(model=model, input="the same question", instructions="sys")
    with c.responses.stream(model=model, input="the same question", instructions="sys") as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()
    assert plain.usage is not None and streamed.usage is not None
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (
        streamed.usage.input_tokens,
        streamed.usage.output_tokens,
    )
    rows = gateway.ledger_rows()
    assert [r["stream"] for r in rows] == [0, 1]
    assert rows[0]["cost_usd"] == rows[1]["cost_usd"] and Decimal(str(rows[0]["cost_usd"])) > 0


def test_client_leaving_mid_stream_leaves_a_499_row_and_stores_nothing(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    import time

    import httpx2 as httpx

    mock.configure(itl_ms=200, tokens=50)
    body = {"model": "small", "input": "a long answer", "stream": True}
    with (
        httpx.Client(timeout=10) as http,
        http.stream("POST", gateway.base_url + "/responses", json=body, headers=gateway.headers()) as resp,
    ):
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break
    deadline = time.monotonic() + 5
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not rows:
        rows = gateway.ledger_rows()
        time.sleep(0.05)
    assert rows and (rows[-1]["status"], rows[-1]["http_status"], rows[-1]["endpoint"]) == (
        "client_disconnected",
        499,
        "responses",
    )
    assert 0 < int(rows[-1]["output_tokens"]) < 50
    store = gateway.app_state.services.responses
    assert store._conn.execute("SELECT count(*) FROM stored_responses").fetchone()[0] == 0


def test_a_chain_of_turns_and_a_broken_chain(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    c = client(gateway)
    one = c.responses.create(model="small", input="turn one")
    two = c.responses.create(model="small", input="turn two", previous_response_id=one.id)
    three = c.responses.create(model="small", input="turn three", previous_response_id=two.id)
    c.responses.create(model="small", input="turn four", previous_response_id=three.id)
    texts = [m["content"] for m in chat_sent(mock)["messages"]]
    assert texts[::2] == ["turn one", "turn two", "turn three", "turn four"] and len(texts) == 7
    c.responses.delete(two.id)
    assert c.responses.retrieve(three.id).id == three.id  # still stored...
    with pytest.raises(openai.NotFoundError) as err:  # ...but its conversation cannot go on
        c.responses.create(model="small", input="turn five", previous_response_id=three.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_a_previous_response_id_chain_keeps_its_model(
    client: Client, gateway: RunningGateway, mock: MockUpstream
) -> None:
    c = client(gateway)
    mock.add_fault(kind="status", status=500, model="claude-mock", times=1)
    first = c.responses.with_raw_response.create(model="anthropic-first", input="start", instructions="sys")
    assert first.headers["x-switchyard-model"] == "small"  # claude failed: the fallback served
    second = c.responses.with_raw_response.create(
        model="anthropic-first", input="go on", instructions="sys", previous_response_id=first.parse().id
    )
    assert second.headers["x-switchyard-model"] == "small"  # and keeps the conversation
    fresh = c.responses.with_raw_response.create(
        model="anthropic-first", input="new task", instructions="sys"
    )
    assert fresh.headers["x-switchyard-model"] == "claude"
    decisions = {r["request_id"]: r["route_decision"] for r in gateway.ledger_rows()}
    assert decisions[second.headers["x-request-id"]] == "sticky"
