"""``/v1/responses`` passed through to an upstream that speaks the Responses API itself
(policy ``providers.X.responses: true``), with the official ``openai`` SDK through a real
gateway and the mock upstream's ``/v1/responses``: the body arrives unchanged but ``model``
(unknown fields, ``reasoning``, ``include``, ``prompt_cache_key``, encrypted reasoning items),
the answer and the typed events come back as the upstream sent them, usage (cached and
reasoning tokens) is priced exactly and the same streamed or not, ``previous_response_id``
chains are kept by the gateway across routes, and a cut stream ends with an error event."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.config.policy import Policy
from load_tests.mock_upstream import MockUpstream
from tests.conftest import require_module
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
PRICE = {"input": Decimal("1.25"), "cached_input": Decimal("0.125"), "output": Decimal("10")}
ENCRYPTED = "gAAAAB" + "q" * 40 + "/+=="
TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


def _policy(mock_url: str) -> str:
    base = mock_policy(mock_url)
    base = base.replace(
        "providers:\n",
        f"providers:\n  mock-oai:\n    type: openai\n    base_url: {mock_url}/v1\n"
        "    api_key: sk-oai-canary-0123456789abcdef\n    responses: true\n",
        1,
    )
    base = base.replace(
        "models:\n",
        "models:\n  gpt: {provider: mock-oai, upstream: mock-gpt, "
        "price: {input: 1.25, cached_input: 0.125, output: 10}}\n",
        1,
    )
    return base.replace("routes:\n", "routes:\n  native:\n    targets: [gpt]\n    retries: 0\n", 1)


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, _policy(mock.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def client(gw: RunningGateway) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0)
    yield c
    c.close()


def sent(mock: MockUpstream) -> list[dict[str, Any]]:
    return [r["body"] for r in mock.requests() if r["path"].endswith("/v1/responses")]


def rows(gw: RunningGateway) -> list[dict[str, Any]]:
    return [r for r in gw.ledger_rows() if r["endpoint"] == "responses"]


def cost(usage: Any) -> Decimal:
    cached = usage.input_tokens_details.cached_tokens
    return (
        (usage.input_tokens - cached) * PRICE["input"]
        + cached * PRICE["cached_input"]
        + usage.output_tokens * PRICE["output"]
    ) / Decimal(10**6)


def raw_events(gw: RunningGateway, body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(event name, data bytes) of a streamed request, read off the wire."""
    out: list[tuple[str, bytes]] = []
    with httpx.stream(
        "POST", gw.base_url + "/responses", json=body, headers={"authorization": f"Bearer {gw.key()}"}
    ) as r:
        assert r.status_code == 200
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, line[6:].encode()))
    return out


def test_the_body_goes_out_unchanged_but_the_model(
    client: openai.OpenAI, gw: RunningGateway, mock: MockUpstream
) -> None:
    items = [
        {"role": "user", "content": "think about it"},
        {"type": "reasoning", "id": "rs_prev", "summary": [], "encrypted_content": ENCRYPTED},
        {"role": "assistant", "content": "I did."},
        {"role": "user", "content": "and now?"},
    ]
    raw = client.responses.with_raw_response.create(
        model="native",
        input=items,  # type: ignore[arg-type]
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="conv-1",
        store=False,
        extra_body={"future_field": {"a": [1, 2.5, None]}, "service_tier": "flex"},
    )
    resp = Response.model_validate(raw.http_response.json())
    (body,) = sent(mock)
    request = orjson.loads(raw.http_response.request.content)
    assert body == {**request, "model": "mock-gpt"} and list(body) == list(request)
    assert body["input"][1]["encrypted_content"] == ENCRYPTED
    # the upstream's own answer: its id, its reasoning item with the encrypted content
    assert resp.id.startswith("resp_mock") and "x-switchyard-dropped" not in raw.headers
    assert resp.output[0].type == "reasoning" and resp.output[0].encrypted_content
    assert raw.headers["x-switchyard-provider"] == "mock-oai"
    (row,) = rows(gw)
    assert row["provider"] == "mock-oai" and row["served_model"] == "gpt" and row["status"] == "ok"
    assert resp.usage is not None and resp.usage.output_tokens_details.reasoning_tokens == 8
    assert row["input_tokens"] == resp.usage.input_tokens and row["output_tokens"] == resp.usage.output_tokens
    assert Decimal(str(row["cost_usd"])) == pytest.approx(cost(resp.usage))


def test_events_are_relayed_as_sent_and_cost_what_the_json_answer_costs(
    client: openai.OpenAI, gw: RunningGateway, mock: MockUpstream
) -> None:
    body = {"model": "native", "input": "stream me", "reasoning": {"effort": "low"}}
    plain = client.responses.create(**body)  # type: ignore[call-overload]
    events = raw_events(gw, {**body, "stream": True})
    parsed = [EVENTS.validate_json(data) for _, data in events]
    assert [name for name, _ in events] == [e.type for e in parsed]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[-1].type == "response.completed" and parsed[0].type == "response.created"
    final = parsed[-1].response
    assert final.output_text == plain.output_text and final.usage == plain.usage
    # relayed untouched: every data line is byte for byte what the upstream's encoder wrote
    assert all(data == orjson.dumps(orjson.loads(data)) for _, data in events)
    assert final.id.startswith("resp_mock")
    streamed, whole = rows(gw)[1], rows(gw)[0]
    assert streamed["stream"] == 1 and streamed["status"] == "ok"
    assert streamed["cost_usd"] == whole["cost_usd"] and Decimal(str(whole["cost_usd"])) > 0
    assert (streamed["input_tokens"], streamed["output_tokens"]) == (
        whole["input_tokens"],
        whole["output_tokens"],
    )
    # the SDK's stream helper reads the same events
    with client.responses.stream(model="native", input="stream me", tools=[TOOL]) as stream:  # type: ignore[list-item]
        for _ in stream:
            pass
        done = stream.get_final_response()
    assert done.output[0].type == "function_call" and done.output[0].name == "get_weather"


def test_cached_tokens_are_priced_as_cached(client: openai.OpenAI, gw: RunningGateway) -> None:
    history = [{"role": "user", "content": "a long stable prefix of many words here"}]
    client.responses.create(model="native", input=history, prompt_cache_key="k1")  # type: ignore[arg-type]
    second = client.responses.create(
        model="native",
        input=[*history, {"role": "user", "content": "next"}],  # type: ignore[list-item]
        prompt_cache_key="k1",
    )
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens == 8
    row = rows(gw)[1]
    assert row["cached_tokens"] == 8
    assert Decimal(str(row["cost_usd"])) == pytest.approx(cost(second.usage))


def test_a_chain_is_kept_by_the_gateway_across_routes(
    client: openai.OpenAI, gw: RunningGateway, mock: MockUpstream
) -> None:
    first = client.responses.create(model="small", input="hello there")  # translated to chat
    second = client.responses.create(model="native", input="and then?", previous_response_id=first.id)
    (body,) = sent(mock)
    assert "previous_response_id" not in body
    assert [i.get("role") for i in body["input"]] == ["user", "assistant", "user"]
    assert body["input"][0] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hello there"}],
        "status": "completed",
    }
    assert body["input"][1]["content"][0]["text"] == first.output_text
    assert body["input"][2] == {"role": "user", "content": "and then?"}
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).previous_response_id == first.id
    # and on: a third turn on the pass-through route sends all of it, streamed this time
    events = raw_events(
        gw, {"model": "native", "input": "more", "previous_response_id": second.id, "stream": True}
    )
    third = orjson.loads(events[-1][1])["response"]
    assert third["previous_response_id"] == second.id
    assert orjson.loads(events[0][1])["response"]["previous_response_id"] == second.id
    body = sent(mock)[-1]
    assert [i.get("role") for i in body["input"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["input"][3]["id"] == second.output[0].id  # the upstream's own items, ids kept
    items = client.responses.input_items.list(third["id"])
    assert [i.type for i in items.data] == ["message"]


def test_a_cut_stream_ends_with_an_error_event(gw: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=3)
    events = raw_events(gw, {"model": "native", "input": "cut me", "stream": True})
    assert events[-1][0] == "error"
    last = EVENTS.validate_json(events[-1][1])
    assert last.type == "error" and last.sequence_number == len(events) - 1
    (row,) = rows(gw)
    assert row["status"] == "stream_broken" and row["http_status"] == 502
    assert len(sent(mock)) == 1  # the Responses upstream's stream was cut


def test_upstream_errors_keep_openai_shape(client: openai.OpenAI, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=400, message="bad things")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="native", input="x")
    assert err.value.status_code == 400 and len(sent(mock)) == 1
    assert "sk-oai-canary" not in str(err.value.body)


def test_which_providers_speak_responses() -> None:
    def provider(extra: str) -> Any:
        doc = f"providers:\n  p:\n    base_url: {extra}\n"
        import yaml

        return Policy.model_validate(yaml.safe_load(doc)).providers["p"]

    assert provider("https://api.openai.com/v1\n    type: openai").speaks_responses
    assert not provider("http://vllm:8000/v1\n    type: openai").speaks_responses
    assert provider("http://proxy/v1\n    type: openai\n    responses: true").speaks_responses
    assert not provider("https://api.openai.com/v1\n    type: openai\n    responses: false").speaks_responses
    assert not provider("https://api.anthropic.com\n    type: anthropic").speaks_responses
    bad = Policy.model_validate(
        {"providers": {"a": {"type": "anthropic", "base_url": "https://x", "responses": True}}}
    )
    assert any(path == "providers.a.responses" for path, _ in bad.cross_reference_errors())


async def test_an_agents_sdk_turn_with_a_tool_passes_through(gw: RunningGateway, mock: MockUpstream) -> None:
    agents = require_module("agents")
    agents.set_tracing_disabled(True)
    aclient = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(q: str) -> str:  # the mock calls a tool with {"q": <the user's text>}
        """The weather for a question."""
        calls.append(q)
        return "sunny, 21C"

    model = agents.OpenAIResponsesModel(model="native", openai_client=aclient)
    helper = agents.Agent(name="weather", instructions="Use tools.", model=model, tools=[get_weather])
    result = await agents.Runner.run(helper, "weather in Paris?")
    await aclient.close()
    assert calls == ["weather in Paris?"] and result.final_output
    bodies = sent(mock)
    assert len(bodies) == 2 and bodies[1]["input"][-1]["type"] == "function_call_output"
    assert [(r["provider"], r["status"]) for r in rows(gw)] == [("mock-oai", "ok")] * 2
