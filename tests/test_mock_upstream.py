"""The mock upstream over real loopback HTTP: OpenAI and Anthropic protocols, faults, control API."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from load_tests.mock_upstream import MockUpstream
from tests.test_conformance import conforms

ROOT = Path(__file__).resolve().parents[1]
ANTHROPIC_HEADERS = {"x-api-key": "ak-test", "anthropic-version": "2023-06-01"}
USER = [{"role": "user", "content": "hello there world"}]


# fixtures -------------------------------------------------------------------
@pytest.fixture
def mock() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=16) as m:
        yield m


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def client(mock: MockUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=mock.base_url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def sse_data(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


def anthropic_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:]
        out.append((lines[0][7:], data))
    return out


# OpenAI ---------------------------------------------------------------------
async def test_chat_completion_matches_schema_and_echo_rule(
    mock: MockUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"model": "gpt-x", "messages": [{"role": "system", "content": "be brief"}, *USER]}
    status, headers, raw = await post(http, mock.base_url + "/v1/chat/completions", body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(raw)
    conforms(ChatCompletion, data)
    assert data["object"] == "chat.completion" and data["model"] == "gpt-x"
    choice = data["choices"][0]
    text = choice["message"]["content"]
    assert text.startswith("echo: hello there world pad") and len(text.split()) == 16
    assert choice["finish_reason"] == "stop" and choice["message"]["refusal"] is None
    assert data["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 16,
        "total_tokens": 21,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_chat_sdk_content_parts_max_tokens_n_and_stop(client: openai.AsyncOpenAI) -> None:
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"}]}
    ]
    r = await client.chat.completions.create(model="m", messages=parts, max_tokens=2, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "echo: alpha" and c.finish_reason == "length" for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 6
    r = await client.chat.completions.create(
        model="m", messages=USER, max_completion_tokens=50, stop=["there"]
    )
    assert r.choices[0].message.content == "echo: hello " and r.choices[0].finish_reason == "stop"


async def test_chat_stream_chunks_and_usage(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, raw = await post(http, mock.base_url + "/v1/chat/completions", body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    data = sse_data(raw)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    for c in chunks:
        conforms(ChatCompletionChunk, c)
        assert c["object"] == "chat.completion.chunk" and c["model"] == "m"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    words = [c["choices"][0]["delta"]["content"] for c in chunks[1:17]]
    assert len(words) == 16 and "".join(words).startswith("echo: hello there world")
    assert chunks[17]["choices"][0]["finish_reason"] == "stop"
    assert chunks[18]["choices"] == [] and chunks[18]["usage"]["completion_tokens"] == 16
    assert all(c["usage"] is None for c in chunks[:18])


async def test_chat_stream_sdk_without_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True, max_tokens=4)
    text, finish, n = "", None, 0
    async for chunk in stream:
        n += 1
        assert chunk.usage is None and chunk.choices
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert text == "echo: hello there world" and finish == "length" and n == 6


async def test_chat_tools_non_streaming_and_streaming(client: openai.AsyncOpenAI) -> None:
    tools = [
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}},
    ]
    r = await client.chat.completions.create(model="m", messages=USER, tools=tools)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None and msg.tool_calls
    call = msg.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "search"
    assert json.loads(call.function.arguments) == {"q": "hello there world"}
    stream = await client.chat.completions.create(model="m", messages=USER, tools=tools, stream=True)
    deltas = [c.choices[0].delta async for c in stream if c.choices]
    first = deltas[0].tool_calls[0]
    assert first.index == 0 and first.id and first.function.name == "search"
    args = "".join(d.tool_calls[0].function.arguments for d in deltas[1:] if d.tool_calls)
    assert json.loads(args) == {"q": "hello there world"}
    assert len([d for d in deltas if d.tool_calls]) > 2  # arguments arrive in pieces
    r = await client.chat.completions.create(model="m", messages=USER, tools=tools, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    forced = {"type": "function", "function": {"name": "other"}}
    r = await client.chat.completions.create(model="m", messages=USER, tools=tools, tool_choice=forced)
    assert r.choices[0].message.tool_calls[0].function.name == "other"


def test_sync_sdk_completions_embeddings_models(mock: MockUpstream) -> None:
    with openai.OpenAI(base_url=mock.base_url + "/v1", api_key="sk", max_retries=0) as c:
        comp = c.completions.create(model="m", prompt="one two", max_tokens=3)
        assert comp.choices[0].text == "echo: one two" and comp.choices[0].finish_reason == "length"
        assert comp.usage is not None and comp.usage.prompt_tokens == 2
        e1 = c.embeddings.create(model="emb", input="same text")  # SDK asks for base64
        e2 = c.embeddings.create(model="emb", input=["same text", "other"], encoding_format="float")
        assert len(e1.data[0].embedding) == 8
        assert e1.data[0].embedding == pytest.approx(e2.data[0].embedding)
        assert e2.data[0].embedding != e2.data[1].embedding
        assert sum(x * x for x in e2.data[1].embedding) == pytest.approx(1.0, rel=1e-5)
        assert "mock-small" in [m.id for m in c.models.list()]


async def test_embeddings_and_models_schema(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    _, _, raw = await post(http, mock.base_url + "/v1/embeddings", {"model": "e", "input": ["a b", "c"]})
    data = json.loads(raw)
    conforms(CreateEmbeddingResponse, data)
    assert data["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    async with http.get(mock.base_url + "/v1/models") as resp:
        listed = await resp.json()
    assert listed["object"] == "list" and listed["data"]
    for item in listed["data"]:
        conforms(Model, item)
    _, _, raw = await post(http, mock.base_url + "/v1/completions", {"model": "m", "prompt": "x"})
    conforms(Completion, json.loads(raw))


async def test_completions_stream(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "prompt": "a b", "stream": True, "max_tokens": 3}
    _, _, raw = await post(http, mock.base_url + "/v1/completions", body)
    data = sse_data(raw)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and "".join(c["choices"][0]["text"] for c in chunks) == "echo: a b"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_errors_are_openai_shaped(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock.base_url + "/v1/chat/completions", {"model": "m"})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    async with http.post(mock.base_url + "/v1/chat/completions", data=b"{nope") as resp:
        assert resp.status == 400
    status, _, raw = await post(http, mock.base_url + "/v1/nothing", {})
    assert status == 404 and "error" in json.loads(raw)


# Anthropic --------------------------------------------------------------------
async def test_anthropic_auth_and_validation(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/messages"
    body = {"model": "claude-x", "max_tokens": 50, "messages": USER}
    for headers in ({}, {"x-api-key": "k"}, {"anthropic-version": "2023-06-01"}):
        status, _, raw = await post(http, url, body, headers)
        assert status == 401
        assert (
            json.loads(raw)["error"]["type"] == "authentication_error" and json.loads(raw)["type"] == "error"
        )
    status, _, raw = await post(http, url, {"model": "claude-x", "messages": USER}, ANTHROPIC_HEADERS)
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


async def test_anthropic_message_and_stop_reasons(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/messages"
    body = {"model": "claude-x", "max_tokens": 50, "system": "sys words", "messages": USER}
    status, _, raw = await post(http, url, body, ANTHROPIC_HEADERS)
    msg = json.loads(raw)
    assert status == 200 and msg["id"].startswith("msg_") and msg["type"] == "message"
    assert msg["role"] == "assistant" and msg["model"] == "claude-x" and msg["stop_reason"] == "end_turn"
    assert msg["content"][0]["type"] == "text" and msg["content"][0]["text"].startswith("echo: hello there")
    assert msg["stop_sequence"] is None
    assert msg["usage"] == {
        "input_tokens": 5,
        "output_tokens": 16,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    _, _, raw = await post(http, url, {**body, "max_tokens": 2}, ANTHROPIC_HEADERS)
    assert json.loads(raw)["stop_reason"] == "max_tokens"
    _, _, raw = await post(http, url, {**body, "stop_sequences": ["there"]}, ANTHROPIC_HEADERS)
    msg = json.loads(raw)
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "there"


async def test_anthropic_stream_event_sequence(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    body = {"model": "claude-x", "max_tokens": 3, "messages": USER, "stream": True}
    status, headers, raw = await post(http, mock.base_url + "/v1/messages", body, ANTHROPIC_HEADERS)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = anthropic_events(raw)
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert "".join(e["delta"]["text"] for n, e in events if n == "content_block_delta") == "echo: hello there"
    assert (
        events[7][1]["delta"]["stop_reason"] == "max_tokens" and events[7][1]["usage"]["output_tokens"] == 3
    )


async def test_anthropic_tool_use(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/messages"
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    body = {"model": "c", "max_tokens": 50, "messages": USER, "tools": tools}
    _, _, raw = await post(http, url, body, ANTHROPIC_HEADERS)
    msg = json.loads(raw)
    block = msg["content"][0]
    assert msg["stop_reason"] == "tool_use" and block["type"] == "tool_use"
    assert block["id"].startswith("toolu_") and block["name"] == "lookup"
    assert block["input"] == {"q": "hello there world"}
    _, _, raw = await post(http, url, {**body, "stream": True}, ANTHROPIC_HEADERS)
    events = anthropic_events(raw)
    assert (
        events[1][1]["content_block"]["type"] == "tool_use" and events[1][1]["content_block"]["input"] == {}
    )
    parts = [e["delta"]["partial_json"] for n, e in events if n == "content_block_delta"]
    assert len(parts) > 1 and json.loads("".join(parts)) == {"q": "hello there world"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    _, _, raw = await post(http, url, {**body, "tool_choice": {"type": "none"}}, ANTHROPIC_HEADERS)
    assert json.loads(raw)["content"][0]["type"] == "text"


async def test_anthropic_prompt_cache_tokens(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    system = [
        {"type": "text", "text": "long cached policy text", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "not cached"},
    ]
    body = {"model": "c", "max_tokens": 5, "system": system, "messages": USER}
    usages = []
    for _ in range(2):
        _, _, raw = await post(http, mock.base_url + "/v1/messages", body, ANTHROPIC_HEADERS)
        usages.append(json.loads(raw)["usage"])
    assert usages[0]["cache_creation_input_tokens"] == 4 and usages[0]["cache_read_input_tokens"] == 0
    assert usages[1]["cache_creation_input_tokens"] == 0 and usages[1]["cache_read_input_tokens"] == 4
    assert usages[0]["input_tokens"] == usages[1]["input_tokens"] == 2 + 3


# latency knobs --------------------------------------------------------------
async def test_ttft_and_itl(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    mock.configure(ttft_ms=150, itl_ms=20, tokens=4)
    body = {"model": "m", "messages": USER, "stream": True}
    t0 = time.perf_counter()
    stamps = []
    async with http.post(mock.base_url + "/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                stamps.append(time.perf_counter() - t0)
    assert len(stamps) == 4
    assert 0.14 <= stamps[0] < 1.0
    assert stamps[-1] - stamps[0] >= 0.055  # three gaps of 20 ms
    mock.configure(ttft_ms=0, itl_ms=0)
    t0 = time.perf_counter()
    await post(http, mock.base_url + "/v1/chat/completions", {"model": "m", "messages": USER})
    assert time.perf_counter() - t0 < 0.1


async def test_config_via_control_api(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock.base_url + "/_mock/config", {"tokens": 3})
    assert status == 200 and json.loads(raw)["tokens"] == 3
    _, _, raw = await post(http, mock.base_url + "/v1/chat/completions", {"model": "m", "messages": USER})
    assert json.loads(raw)["choices"][0]["message"]["content"] == "echo: hello there"
    status, _, _ = await post(http, mock.base_url + "/_mock/config", {"bogus": 1})
    assert status == 400


# faults ---------------------------------------------------------------------
CHAT = {"model": "m", "messages": USER}
STREAM = {**CHAT, "stream": True}


async def test_fault_status_retry_after_body_and_model_match(
    mock: MockUpstream, http: aiohttp.ClientSession
) -> None:
    url = mock.base_url + "/v1/chat/completions"
    mock.add_fault(kind="status", status=503, model="other", retry_after=3)
    mock.add_fault(kind="status", status=418, body={"custom": True})
    status, _, raw = await post(http, url, CHAT)  # model "m": skips the "other" fault
    assert status == 418 and json.loads(raw) == {"custom": True}
    assert (await post(http, url, CHAT))[0] == 200
    status, headers, raw = await post(http, url, {**CHAT, "model": "other"})
    assert (
        status == 503 and headers["Retry-After"] == "3" and json.loads(raw)["error"]["type"] == "server_error"
    )
    mock.add_fault(kind="status", status=429, times=2)
    assert [(await post(http, url, CHAT))[0] for _ in range(3)] == [429, 429, 200]
    mock.add_fault(kind="status", status=529)
    status, _, raw = await post(
        http, mock.base_url + "/v1/messages", {**CHAT, "max_tokens": 5}, ANTHROPIC_HEADERS
    )
    assert status == 529 and json.loads(raw)["error"]["type"] == "overloaded_error"


async def test_fault_control_api_over_http(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    base = mock.base_url
    faults = {"faults": [{"kind": "status", "status": 500}, {"kind": "status", "status": 502}]}
    status, _, raw = await post(http, base + "/_mock/faults", faults)
    assert status == 200 and json.loads(raw)["queued"] == 2
    assert len(mock.faults()) == 2
    async with http.delete(base + "/_mock/faults") as resp:
        assert resp.status == 200
    assert mock.faults() == []
    status, _, _ = await post(http, base + "/_mock/faults", {"faults": [{"kind": "bogus"}]})
    assert status == 400
    assert (await post(http, base + "/v1/chat/completions", CHAT))[0] == 200


async def test_fault_stall_and_stall_mid_stream(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/chat/completions"
    mock.add_fault(kind="stall", seconds=0.3)
    t0 = time.perf_counter()
    assert (await post(http, url, CHAT))[0] == 200
    assert time.perf_counter() - t0 >= 0.29
    mock.add_fault(kind="stall_mid_stream", after_chunks=3, seconds=0.3)
    t0 = time.perf_counter()
    stamps = []
    async with http.post(url, json=STREAM) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                stamps.append(time.perf_counter() - t0)
    assert len(stamps) == 19 and stamps[2] < 0.2 and stamps[3] >= 0.29


async def test_fault_cut_mid_stream(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=2)
    lines = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(mock.base_url + "/v1/chat/completions", json=STREAM) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    lines.append(line)
    assert len(lines) == 2
    mock.add_fault(kind="cut_mid_stream")
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(mock.base_url + "/v1/chat/completions", json=CHAT) as resp:
            await resp.read()


async def test_fault_malformed_sse_and_json(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/chat/completions"
    mock.add_fault(kind="malformed_sse", after_chunks=1)
    _, _, raw = await post(http, url, STREAM)
    data = sse_data(raw)
    assert data[1] == "{not json" and data[-1] == "[DONE]"
    mock.add_fault(kind="malformed_json")
    status, headers, raw = await post(http, url, CHAT)
    assert status == 200 and headers["Content-Type"] == "application/json" and raw == b'{"id": '
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)


async def test_fault_wrong_content_type_and_huge(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/chat/completions"
    mock.add_fault(kind="wrong_content_type")
    status, headers, raw = await post(http, url, CHAT)
    assert status == 200 and headers["Content-Type"].startswith("text/html") and raw.startswith(b"<html>")
    mock.add_fault(kind="huge", bytes=3_000_000)
    status, _, raw = await post(http, url, CHAT)
    assert status == 200 and len(json.loads(raw)["choices"][0]["message"]["content"]) == 3_000_000


async def test_fault_reset(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    mock.add_fault(kind="reset")
    with pytest.raises(aiohttp.ClientError):
        await post(http, mock.base_url + "/v1/chat/completions", CHAT)
    assert (await post(http, mock.base_url + "/v1/chat/completions", CHAT))[0] == 200


async def test_openai_sdk_sees_faults_as_errors(mock: MockUpstream, client: openai.AsyncOpenAI) -> None:
    mock.add_fault(kind="status", status=500)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="m", messages=USER)
    mock.add_fault(kind="status", status=429, retry_after=1)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="m", messages=USER)


# recording, transport ---------------------------------------------------------
async def test_requests_are_recorded(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "unknown_field": {"x": 1}}
    await post(http, mock.base_url + "/v1/chat/completions", body, {"Authorization": "Bearer up-key"})
    await post(http, mock.base_url + "/_mock/config", {})  # control calls are not recorded
    recorded = mock.requests()
    assert len(recorded) == 1
    assert recorded[0]["path"] == "/v1/chat/completions" and recorded[0]["method"] == "POST"
    assert recorded[0]["headers"]["authorization"] == "Bearer up-key"
    assert recorded[0]["body"]["unknown_field"] == {"x": 1}
    async with http.get(mock.base_url + "/_mock/requests") as resp:
        assert (await resp.json())["requests"][0]["body"] == body
    async with http.delete(mock.base_url + "/_mock/requests") as resp:
        assert resp.status == 200
    assert mock.requests() == []


async def test_keep_alive_and_pipelining(mock: MockUpstream) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", mock.port)
    payload = json.dumps(CHAT).encode()
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    mock.configure(ttft_ms=30)  # first answer is delayed, the second must still come after it
    writer.write(req * 3)
    await writer.drain()
    ids = []
    for _ in range(3):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        ids.append(json.loads(await reader.readexactly(length))["id"])
    assert ids == sorted(ids) and len(set(ids)) == 3
    writer.close()
    await writer.wait_closed()


def test_restart_and_two_instances() -> None:
    with MockUpstream() as a, MockUpstream() as b:
        assert a.port != b.port
    a.start()
    try:
        with socket.create_connection(("127.0.0.1", a.port), timeout=2):
            pass
    finally:
        a.stop()


def test_cli_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "load_tests.mock_upstream", "--port", "0", "--tokens", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as c:
            r = c.chat.completions.create(model="m", messages=USER)
        assert r.choices[0].message.content == "echo: hello"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_anthropic_stream_faults(mock: MockUpstream, http: aiohttp.ClientSession) -> None:
    url = mock.base_url + "/v1/messages"
    body = {"model": "c", "max_tokens": 3, "messages": USER, "stream": True}
    mock.add_fault(kind="malformed_sse", after_chunks=3, model="c")
    _, _, raw = await post(http, url, body, ANTHROPIC_HEADERS)
    assert "event: content_block_delta\ndata: {not json\n\n" in raw.decode()
    assert raw.decode().index("{not json") > raw.decode().index("event: ping")
    mock.add_fault(kind="cut_mid_stream", after_chunks=4)
    with pytest.raises(aiohttp.ClientPayloadError):
        await post(http, url, body, ANTHROPIC_HEADERS)
