"""The official ``openai`` SDK against the real gateway (loopback HTTP) and the mock upstream.

Every test here is what an application sees: parsed objects, streams, the SDK's own error
classes, headers through ``with_raw_response``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

HELLO = [{"role": "user", "content": "hello"}]
HELLO_REPLY = "echo: hello pad pad pad pad pad pad"  # the mock's echo rule, 8 words
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key(), max_retries=0, timeout=30) as c:
        yield c


def client_for(
    gateway: RunningGateway, tenant: str = "team-a", *, api_key: str | None = None
) -> openai.OpenAI:
    key = api_key or gateway.key(tenant)
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def chat_requests(mock: MockUpstream) -> list[dict[str, Any]]:
    return [r for r in mock.requests() if r["path"] in ("/v1/chat/completions", "/v1/messages")]


def collect_stream(stream: Any) -> tuple[str, list[Any]]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def assemble_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Merge streamed tool-call deltas the way an SDK user must."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
    return calls


# --------------------------------------------------------------------------- chat


def test_chat_non_streaming(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.chat.completions.create(model="auto", messages=HELLO)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == HELLO_REPLY
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens == 1
    sent = chat_requests(mock)
    assert len(sent) == 1 and sent[0]["body"]["model"] == "mock-small"


def test_requests_have_their_rows_committed_on_the_loop(gateway: RunningGateway) -> None:
    """While the writer idles, the ledger row a response waits for is committed on the event
    loop (no writer round trip): plain and streamed alike, and the rows are all there."""
    ledger = gateway.app_state.services.ledger
    before = ledger.inline_commits
    with client_for(gateway) as client:
        for i in range(3):
            time.sleep(0.01)
            client.chat.completions.create(model="auto", messages=[{"role": "user", "content": f"quiet {i}"}])
            time.sleep(0.01)
            collect_stream(client.chat.completions.create(model="auto", messages=HELLO, stream=True))
    # a row that meets the writer's roll or a checkpoint RESTART (they hold the lock) goes
    # through the writer instead: legitimate, so one or two may
    assert ledger.inline_commits - before >= 4
    assert len(gateway.ledger_rows()) == 6


async def test_async_chat_and_stream(gateway: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key(), max_retries=0) as client:
        resp = await client.chat.completions.create(model="auto", messages=HELLO)
        assert resp.choices[0].message.content == HELLO_REPLY
        stream = await client.chat.completions.create(
            model="anthropic-first", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == HELLO_REPLY
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
def test_stream_with_usage_ends_with_usage_chunk(client: openai.OpenAI, route: str) -> None:
    stream = client.chat.completions.create(
        model=route, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    text, chunks = collect_stream(stream)
    assert text == HELLO_REPLY
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 8
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert [c for c in chunks[:-1] if c.usage is not None] == []
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert len({c.id for c in chunks}) == 1


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI, route: str) -> None:
    text, chunks = collect_stream(client.chat.completions.create(model=route, messages=HELLO, stream=True))
    assert text == HELLO_REPLY
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks), "a usage-only chunk (choices == []) arrived unasked"


# --------------------------------------------------------------------------- tools


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
def test_tool_call_non_streaming(client: openai.OpenAI, route: str) -> None:
    resp = client.chat.completions.create(
        model=route, messages=[{"role": "user", "content": "weather in Oslo"}], tools=[WEATHER_TOOL]
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert calls[0].id
    assert json.loads(calls[0].function.arguments) == {"q": "weather in Oslo"}


@pytest.mark.parametrize("route", ["auto", "anthropic-first"])
def test_tool_call_streaming_deltas_assemble(client: openai.OpenAI, route: str) -> None:
    stream = client.chat.completions.create(
        model=route,
        messages=[{"role": "user", "content": "weather in Oslo"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    chunks = list(stream)
    calls = assemble_tool_calls(chunks)
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == {"q": "weather in Oslo"}
    arg_chunks = [
        c
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls and c.choices[0].delta.tool_calls[0].function
    ]
    assert len(arg_chunks) > 2, "arguments should arrive in several deltas"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_tool_result_round_trip_via_anthropic(client: openai.OpenAI, mock: MockUpstream) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "weather in Oslo"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"q":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    resp = client.chat.completions.create(model="anthropic-first", messages=messages)
    # Anthropic wants the tool result inside the next user turn: the mock echoes both texts.
    assert resp.choices[0].message.content == "echo: sunny thanks pad pad pad pad pad"
    (sent,) = chat_requests(mock)
    assert sent["path"] == "/v1/messages"
    assistant, user = sent["body"]["messages"][1:]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"q": "Oslo"}}
    ]
    assert user["role"] == "user"
    assert user["content"][0]["type"] == "tool_result" and user["content"][0]["tool_use_id"] == "call_1"
    assert user["content"][-1] == {"type": "text", "text": "thanks"}


# --------------------------------------------------------------------------- parameters


def test_openai_parameters_are_accepted_and_forwarded(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.chat.completions.create(
        model="auto",
        messages=HELLO,
        response_format={"type": "json_object"},
        n=2,
        stop=["zzz"],
        seed=42,
        logprobs=True,
        top_logprobs=2,
        user="user-123",
        max_completion_tokens=5,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.content == "echo: hello pad pad pad" for c in resp.choices)
    assert all(c.finish_reason == "length" for c in resp.choices)
    (sent,) = chat_requests(mock)
    body = sent["body"]
    assert body["response_format"] == {"type": "json_object"}
    assert body["n"] == 2 and body["stop"] == ["zzz"] and body["seed"] == 42
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["user"] == "user-123" and body["max_completion_tokens"] == 5
    assert body["presence_penalty"] == 0.5 and body["frequency_penalty"] == 0.25


def test_stop_sequence_cuts_the_reply(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="auto", messages=HELLO, stop=" pad")
    assert resp.choices[0].message.content == "echo: hello"
    assert resp.choices[0].finish_reason == "stop"


def test_unknown_extra_field_reaches_upstream(client: openai.OpenAI, mock: MockUpstream) -> None:
    client.chat.completions.create(model="auto", messages=HELLO, extra_body={"my_vendor_flag": 7})
    (sent,) = chat_requests(mock)
    assert sent["body"]["my_vendor_flag"] == 7


def test_pinned_route_params_override_the_client(client: openai.OpenAI, mock: MockUpstream) -> None:
    client.chat.completions.create(model="code", messages=HELLO, temperature=1.5, top_p=0.9)
    client.chat.completions.create(model="creative", messages=HELLO)
    client.chat.completions.create(
        model="creative", messages=[{"role": "user", "content": "x"}], temperature=2
    )
    code, creative_default, creative_capped = (r["body"] for r in chat_requests(mock))
    assert (code["temperature"], code["top_p"]) == (0.1, 0.2)
    assert creative_default["temperature"] == 0.9
    assert creative_capped["temperature"] == 1.2


# --------------------------------------------------------------------------- other endpoints


def test_models_list_shows_what_the_key_may_use(gateway: RunningGateway) -> None:
    with client_for(gateway, "team-a") as a, client_for(gateway, "team-b") as b:
        ids_a = {m.id for m in a.models.list()}
        ids_b = [m.id for m in b.models.list()]
    assert ids_a == {
        "auto",
        "anthropic-first",
        "code",
        "creative",
        "restricted",
        "small",
        "large",
        "claude",
        "embed",
        "legacy",
    }
    assert sorted(ids_b) == ["auto", "small"]


def test_embeddings(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.embeddings.create(model="embed", input=["a", "b"])
    assert [d.index for d in resp.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in resp.data)
    assert resp.data[0].embedding != resp.data[1].embedding
    assert abs(sum(x * x for x in resp.data[0].embedding) - 1.0) < 1e-5
    assert resp.usage.prompt_tokens == 2
    (sent,) = [r for r in mock.requests() if r["path"] == "/v1/embeddings"]
    assert sent["body"]["model"] == "mock-embed" and sent["body"]["input"] == ["a", "b"]


def test_completions(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.completions.create(model="legacy", prompt="hi")
    assert resp.object == "text_completion"
    assert resp.choices[0].text == "echo: hi pad pad pad pad pad pad"
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    (sent,) = [r for r in mock.requests() if r["path"] == "/v1/completions"]
    assert sent["body"]["model"] == "mock-legacy"


def test_chat_on_an_embeddings_model_is_a_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="embed", messages=HELLO)
    assert info.value.param == "model"


# --------------------------------------------------------------------------- errors


def test_bad_key_is_authentication_error(gateway: RunningGateway, mock: MockUpstream) -> None:
    bad_key = "sk-sy-not-a-real-key-000000000000000000000000"
    with client_for(gateway, api_key=bad_key) as c, pytest.raises(openai.AuthenticationError) as info:
        c.chat.completions.create(model="auto", messages=HELLO)
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    assert chat_requests(mock) == []


def test_missing_key_is_401(gateway: RunningGateway, mock: MockUpstream) -> None:
    body = {"model": "auto", "messages": HELLO}
    r = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    assert chat_requests(mock) == []


def test_tenant_outside_its_models_is_permission_denied(gateway: RunningGateway) -> None:
    with client_for(gateway, "team-b") as c, pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(model="restricted", messages=HELLO)
    assert info.value.status_code == 403
    assert "restricted" in info.value.message


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-nonexistent", messages=HELLO)
    assert info.value.status_code == 404
    assert "gpt-nonexistent" in info.value.message


def test_invalid_temperature_is_bad_request(client: openai.OpenAI, mock: MockUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="auto", messages=HELLO, temperature=5)
    assert "temperature" in info.value.message
    assert info.value.param == "temperature"
    assert chat_requests(mock) == []


def test_tenant_over_rpm_is_rate_limited_with_retry_after(gateway: RunningGateway) -> None:
    with client_for(gateway, "team-b") as c:
        for _ in range(5):
            c.chat.completions.create(model="auto", messages=HELLO)
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model="auto", messages=HELLO)
    retry_after = info.value.response.headers.get("retry-after")
    assert retry_after is not None and int(retry_after) >= 1
    assert info.value.status_code == 429


def test_upstream_500_everywhere_is_internal_server_error_502(
    client: openai.OpenAI, mock: MockUpstream
) -> None:
    mock.add_fault(kind="status", status=500, model="mock-small", times=10)
    mock.add_fault(kind="status", status=500, model="mock-large", times=10)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="auto", messages=HELLO)
    assert info.value.status_code == 502
    models = [r["body"]["model"] for r in chat_requests(mock)]
    assert models == ["mock-small", "mock-small", "mock-large", "mock-large"]  # retries 1, then fallback


def test_upstream_500_on_first_target_falls_back(client: openai.OpenAI, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=500, model="mock-small", times=2)
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
    assert raw.headers["x-switchyard-model"] == "large"
    assert raw.headers["x-switchyard-attempts"] == "3"
    assert raw.parse().choices[0].message.content == HELLO_REPLY


def test_upstream_429_everywhere_is_rate_limit_error(client: openai.OpenAI, mock: MockUpstream) -> None:
    # Retry-After above the gateway's cap: no retry on the same target, straight to the next.
    mock.add_fault(kind="status", status=429, retry_after=30, times=10)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="auto", messages=HELLO)
    assert info.value.status_code == 429
    assert info.value.response.headers.get("retry-after") == "30"
    assert [r["body"]["model"] for r in chat_requests(mock)] == ["mock-small", "mock-large"]


def test_upstream_429_short_retry_after_is_retried(client: openai.OpenAI, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=429, retry_after=0.2, model="mock-small")
    resp = client.chat.completions.create(model="auto", messages=HELLO)
    assert resp.choices[0].message.content == HELLO_REPLY
    assert [r["body"]["model"] for r in chat_requests(mock)] == ["mock-small", "mock-small"]


def test_stall_past_attempt_timeout_is_504(tmp_path: Path, mock: MockUpstream) -> None:
    quick = "routes:\n  quick:\n    targets: [small]\n    retries: 0\n    attempt_timeout_s: 0.5\n"
    gw = start_gateway(tmp_path, mock_policy(mock.base_url).replace("routes:\n", quick, 1))
    try:
        mock.add_fault(kind="stall", seconds=3)
        with client_for(gw) as c, pytest.raises(openai.InternalServerError) as info:
            c.chat.completions.create(model="quick", messages=HELLO)
        assert info.value.status_code == 504
        assert info.value.code == "upstream_timeout"
        mock.add_fault(kind="stall", seconds=3)
        with client_for(gw) as c, pytest.raises(openai.InternalServerError) as info:
            c.chat.completions.create(model="quick", messages=HELLO, stream=True)
        assert info.value.status_code == 504
    finally:
        gw.stop()


# --------------------------------------------------------------------------- exact cache


def test_exact_cache_hit_on_second_deterministic_request(client: openai.OpenAI, mock: MockUpstream) -> None:
    first = client.chat.completions.with_raw_response.create(model="auto", messages=HELLO, temperature=0)
    second = client.chat.completions.with_raw_response.create(model="auto", messages=HELLO, temperature=0)
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "hit"
    assert (
        second.parse().choices[0].message.content == first.parse().choices[0].message.content == HELLO_REPLY
    )
    assert len(chat_requests(mock)) == 1


def test_no_cache_header_bypasses_the_cache(client: openai.OpenAI, mock: MockUpstream) -> None:
    client.chat.completions.create(model="auto", messages=HELLO, temperature=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HELLO, temperature=0, extra_headers={"Cache-Control": "no-cache"}
    )
    assert raw.headers["x-switchyard-cache"] == "bypass"
    assert len(chat_requests(mock)) == 2


def test_non_deterministic_requests_are_not_cached(client: openai.OpenAI, mock: MockUpstream) -> None:
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(model="auto", messages=HELLO, temperature=0.7)
        assert raw.headers["x-switchyard-cache"] == "bypass"
    assert len(chat_requests(mock)) == 2


def test_streaming_request_replays_a_cached_answer_as_sse(client: openai.OpenAI, mock: MockUpstream) -> None:
    first = client.chat.completions.create(model="auto", messages=HELLO, temperature=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HELLO, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    assert raw.headers["x-switchyard-cache"] == "hit"
    assert raw.headers["content-type"].startswith("text/event-stream")
    text, chunks = collect_stream(raw.parse())
    assert text == first.choices[0].message.content == HELLO_REPLY
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == first.usage.completion_tokens  # type: ignore[union-attr]
    assert len(chat_requests(mock)) == 1


def test_cached_tool_call_replays_as_stream(client: openai.OpenAI, mock: MockUpstream) -> None:
    msgs: list[Any] = [{"role": "user", "content": "weather in Oslo"}]
    first = client.chat.completions.create(model="auto", messages=msgs, tools=[WEATHER_TOOL], seed=1)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=msgs, tools=[WEATHER_TOOL], seed=1, stream=True
    )
    assert raw.headers["x-switchyard-cache"] == "hit"
    calls = assemble_tool_calls(list(raw.parse()))
    expected = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert calls == {0: {"id": expected.id, "name": "get_weather", "arguments": expected.function.arguments}}
    assert len(chat_requests(mock)) == 1


def test_cache_is_per_tenant(gateway: RunningGateway, mock: MockUpstream) -> None:
    with client_for(gateway, "team-a") as a, client_for(gateway, "team-b") as b:
        a.chat.completions.create(model="auto", messages=HELLO, temperature=0)
        other = b.chat.completions.with_raw_response.create(model="auto", messages=HELLO, temperature=0)
        again = b.chat.completions.with_raw_response.create(model="auto", messages=HELLO, temperature=0)
    assert other.headers["x-switchyard-cache"] == "miss"
    assert again.headers["x-switchyard-cache"] == "hit"
    assert len(chat_requests(mock)) == 2
