"""AnthropicProvider against real HTTP servers on loopback: the shared mock upstream, plus a
tiny aiohttp server for byte-level SSE framing cases the mock does not produce."""

from __future__ import annotations

import asyncio
import json
import socket
import traceback
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.core.errors import (
    StreamBrokenError,
    SwitchyardError,
    UpstreamError,
    UpstreamRateLimitedError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
)
from gateway.core.types import Price, Target, Usage
from gateway.providers import http as http_module
from gateway.providers.anthropic import AnthropicProvider
from load_tests.mock_upstream import MockUpstream

API_KEY = "sk-ant-CANARY-9f8e7d6c5b4a"
PROMPT = "canary prompt zebra-quartz"
TARGET = Target(
    model="claude-catalog",
    provider="anth",
    upstream_model="claude-up-1",
    price=Price(Decimal(3), Decimal(15)),
)


def body(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": PROMPT}], "stream": stream, **extra}


def assert_clean(exc: BaseException) -> None:
    """Neither the API key nor the prompt appears anywhere an error could be shown or logged."""
    shown = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    if isinstance(exc, SwitchyardError):
        shown += [exc.message, orjson.dumps(exc.to_body()).decode()]
    for text in shown:
        assert API_KEY not in text
        assert PROMPT not in text


@pytest.fixture(scope="module")
def mock() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=6) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_mock(mock: MockUpstream) -> None:
    mock.reset()
    mock.configure(ttft_ms=0, itl_ms=0, tokens=6)


@pytest.fixture
async def provider(mock: MockUpstream) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider("anth", mock.base_url + "/", API_KEY, headers={"anthropic-beta": "test-beta"})
    yield p
    await p.aclose()


async def collect(stream: Any) -> list[dict[str, Any]]:
    return [chunk async for chunk in stream]


# ------------------------------------------------------------------------------ happy paths


async def test_chat_non_streaming(provider: AnthropicProvider, mock: MockUpstream) -> None:
    result = await provider.chat(body(max_tokens=50, temperature=1.5), TARGET, timeout=5)
    msg = result.body["choices"][0]
    assert msg["message"]["content"].startswith(f"echo: {PROMPT}")
    assert msg["finish_reason"] == "stop"
    assert result.body["object"] == "chat.completion"
    assert result.body["model"] == "claude-up-1"
    assert result.usage.output_tokens == 6
    assert result.body["usage"] == result.usage.to_openai()
    (recorded,) = mock.requests()
    assert recorded["path"] == "/v1/messages"
    headers = recorded["headers"]
    assert headers["x-api-key"] == API_KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json"
    assert headers["anthropic-beta"] == "test-beta"
    assert recorded["body"] == {
        "model": "claude-up-1",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
        "temperature": 1.0,
    }


async def test_cache_usage_is_normalised(provider: AnthropicProvider) -> None:
    cached_system = {
        "role": "system",
        "content": [
            {"type": "text", "text": "one two three four five", "cache_control": {"type": "ephemeral"}}
        ],
    }
    req = {"model": "auto", "messages": [cached_system, {"role": "user", "content": "six seven"}]}
    first = await provider.chat(req, TARGET, timeout=5)
    second = await provider.chat(req, TARGET, timeout=5)
    # The mock counts words: 5 cacheable system words + 2 user words.
    assert first.usage == Usage(input_tokens=7, output_tokens=6, cached_input_tokens=0, cache_write_tokens=5)
    assert second.usage == Usage(input_tokens=7, output_tokens=6, cached_input_tokens=5, cache_write_tokens=0)
    assert second.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}


async def test_stream_text(provider: AnthropicProvider, mock: MockUpstream) -> None:
    stream = await provider.chat_stream(body(stream=False), TARGET, timeout=5, idle_timeout=5)
    chunks = await collect(stream)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.startswith(f"echo: {PROMPT}")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert len({c["id"] for c in chunks}) == 1
    assert stream.usage is not None and stream.usage.output_tokens == 6
    assert chunks[-1]["usage"] == stream.usage.to_openai()
    assert mock.requests()[0]["body"]["stream"] is True
    assert mock.requests()[0]["headers"]["accept"] == "text/event-stream"
    await stream.aclose()


async def test_stream_tool_call(provider: AnthropicProvider, mock: MockUpstream) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    req = body(stream=True, tools=tools, tool_choice={"type": "function", "function": {"name": "lookup"}})
    stream = await provider.chat_stream(req, TARGET, timeout=5, idle_timeout=5)
    chunks = await collect(stream)
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0]["id"].startswith("toolu_") and calls[0]["function"]["name"] == "lookup"
    assert all(call["index"] == 0 for call in calls)
    assert json.loads("".join(call["function"]["arguments"] for call in calls)) == {"q": PROMPT}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert mock.requests()[0]["body"]["tool_choice"] == {"type": "tool", "name": "lookup"}


async def test_non_streaming_tool_call(provider: AnthropicProvider) -> None:
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    result = await provider.chat(body(tools=tools, tool_choice="required"), TARGET, timeout=5)
    choice = result.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"q": PROMPT}


async def test_unsupported_endpoints(provider: AnthropicProvider) -> None:
    for call in (provider.completions, provider.embeddings):
        with pytest.raises(UpstreamError) as info:
            await call({"model": "x", "input": "y"}, TARGET, 5)
        assert info.value.code == "unsupported" and not info.value.retryable


def test_repr_hides_key() -> None:
    assert API_KEY not in repr(AnthropicProvider("anth", "http://127.0.0.1:1", API_KEY))


# ------------------------------------------------------------------------------ HTTP errors


@pytest.mark.parametrize("streaming", [False, True])
async def test_429_maps_to_rate_limited_with_retry_after(
    provider: AnthropicProvider, mock: MockUpstream, streaming: bool
) -> None:
    mock.add_fault(kind="status", status=429, retry_after=7)
    with pytest.raises(UpstreamRateLimitedError) as info:
        if streaming:
            await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
        else:
            await provider.chat(body(), TARGET, timeout=5)
    assert info.value.retry_after == 7.0 and info.value.retryable and info.value.upstream_status == 429
    assert_clean(info.value)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    ("status", "retryable", "exc_type"),
    [
        (500, True, UpstreamError),
        (529, True, UpstreamError),
        (401, False, UpstreamError),
        (404, False, UpstreamError),
        (400, False, UpstreamRejectedError),
    ],
)
async def test_status_errors(
    provider: AnthropicProvider,
    mock: MockUpstream,
    streaming: bool,
    status: int,
    retryable: bool,
    exc_type: type[UpstreamError],
) -> None:
    mock.add_fault(kind="status", status=status)
    with pytest.raises(exc_type) as info:
        if streaming:
            await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
        else:
            await provider.chat(body(), TARGET, timeout=5)
    assert info.value.retryable is retryable
    assert info.value.upstream_status == status
    assert_clean(info.value)


async def test_real_401_without_key(mock: MockUpstream) -> None:
    p = AnthropicProvider("anth", mock.base_url, None)
    try:
        with pytest.raises(UpstreamError) as info:
            await p.chat(body(), TARGET, timeout=5)
    finally:
        await p.aclose()
    assert info.value.code == "upstream_auth_failed" and not info.value.retryable
    assert "x-api-key" not in mock.requests()[0]["headers"]


@pytest.mark.parametrize("kind", ["malformed_json", "wrong_content_type"])
async def test_bad_bodies(provider: AnthropicProvider, mock: MockUpstream, kind: str) -> None:
    mock.add_fault(kind=kind)
    with pytest.raises(UpstreamError) as info:
        await provider.chat(body(), TARGET, timeout=5)
    assert info.value.code == "upstream_bad_response" and info.value.retryable
    assert_clean(info.value)


async def test_wrong_content_type_on_stream(provider: AnthropicProvider, mock: MockUpstream) -> None:
    mock.add_fault(kind="wrong_content_type")
    with pytest.raises(UpstreamError) as info:
        await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
    assert info.value.code == "upstream_bad_response"


async def test_huge_body_is_refused(
    provider: AnthropicProvider, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_module, "MAX_RESPONSE_BYTES", 10_000)
    mock.add_fault(kind="huge", bytes=50_000)
    with pytest.raises(UpstreamError) as info:
        await provider.chat(body(), TARGET, timeout=5)
    assert info.value.code == "upstream_bad_response"


@pytest.mark.parametrize("streaming", [False, True])
async def test_reset_is_retryable(provider: AnthropicProvider, mock: MockUpstream, streaming: bool) -> None:
    mock.add_fault(kind="reset")
    with pytest.raises(UpstreamError) as info:
        if streaming:
            await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
        else:
            await provider.chat(body(), TARGET, timeout=5)
    assert info.value.retryable
    assert_clean(info.value)


async def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    p = AnthropicProvider("anth", f"http://127.0.0.1:{port}", API_KEY)
    try:
        with pytest.raises(UpstreamError) as info:
            await p.chat(body(), TARGET, timeout=5)
    finally:
        await p.aclose()
    assert info.value.code == "upstream_connect_error" and info.value.retryable
    assert_clean(info.value)


# ------------------------------------------------------------------------------ timeouts and broken streams


@pytest.mark.parametrize("streaming", [False, True])
async def test_stall_before_answer_times_out(
    provider: AnthropicProvider, mock: MockUpstream, streaming: bool
) -> None:
    mock.add_fault(kind="stall", seconds=2)
    with pytest.raises(UpstreamTimeoutError) as info:
        if streaming:
            await provider.chat_stream(body(), TARGET, timeout=0.3, idle_timeout=5)
        else:
            await provider.chat(body(), TARGET, timeout=0.3)
    assert info.value.retryable and info.value.status == 504
    assert_clean(info.value)


async def test_chat_timeout_bounds_the_whole_call(provider: AnthropicProvider, mock: MockUpstream) -> None:
    mock.add_fault(kind="stall_mid_stream", seconds=2)  # non-streaming: half the body, then a pause
    with pytest.raises(UpstreamTimeoutError):
        await provider.chat(body(), TARGET, timeout=0.3)


async def test_cut_mid_stream_raises_during_iteration(
    provider: AnthropicProvider, mock: MockUpstream
) -> None:
    mock.add_fault(kind="cut_mid_stream", after_chunks=4)
    stream = await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
    received: list[dict[str, Any]] = []
    with pytest.raises(StreamBrokenError) as info:
        async for chunk in stream:
            received.append(chunk)
    assert [c["choices"][0]["delta"] for c in received][:2] == [
        {"role": "assistant", "content": ""},
        {"content": "echo:"},
    ]
    assert stream.usage is not None and stream.usage.input_tokens is not None  # known from message_start
    assert_clean(info.value)
    await stream.aclose()


async def test_stall_mid_stream_hits_idle_timeout(provider: AnthropicProvider, mock: MockUpstream) -> None:
    mock.add_fault(kind="stall_mid_stream", after_chunks=3, seconds=2)
    stream = await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=0.3)
    with pytest.raises(StreamBrokenError) as info:
        await collect(stream)
    assert "stalled" in info.value.message
    await stream.aclose()


async def test_malformed_sse_breaks_the_stream(provider: AnthropicProvider, mock: MockUpstream) -> None:
    mock.add_fault(kind="malformed_sse", after_chunks=3)
    stream = await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
    with pytest.raises(StreamBrokenError) as info:
        await collect(stream)
    assert "malformed" in info.value.message
    assert_clean(info.value)


async def test_aclose_mid_stream_then_reuse(provider: AnthropicProvider, mock: MockUpstream) -> None:
    mock.configure(itl_ms=20, tokens=50)
    stream = await provider.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
    iterator = aiter(stream)
    await anext(iterator)
    await anext(iterator)
    await stream.aclose()
    mock.configure(itl_ms=0, tokens=3)
    result = await provider.chat(body(), TARGET, timeout=5)
    assert result.usage.output_tokens == 3


# ------------------------------------------------------------------------------ SSE framing (own server)

TEXT_EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {"id": "msg_x", "usage": {"input_tokens": 3, "output_tokens": 1}},
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "héllo"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    ),
    ("message_stop", {"type": "message_stop"}),
]


def error_event(etype: str) -> tuple[str, dict[str, Any]]:
    return ("error", {"type": "error", "error": {"type": etype, "message": "injected"}})


def sse(events: list[tuple[str, dict[str, Any]]], newline: bytes = b"\n") -> bytes:
    out = b""
    for name, data in events:
        out += b": comment" + newline + b"event: " + name.encode() + newline
        out += b"data: " + orjson.dumps(data) + newline + newline
    return out


async def serve_bytes(payload: bytes, piece: int) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(payload), piece):
            await resp.write(payload[i : i + piece])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize(("newline", "piece"), [(b"\n", 1), (b"\r\n", 3), (b"\r\n", 10_000)])
async def test_events_split_across_reads(newline: bytes, piece: int) -> None:
    runner, url = await serve_bytes(sse(TEXT_EVENTS, newline), piece)
    p = AnthropicProvider("anth", url, API_KEY)
    try:
        stream = await p.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
        chunks = await collect(stream)
    finally:
        await p.aclose()
        await runner.cleanup()
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""},
        {"content": "héllo"},
    ]
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert stream.usage == Usage(input_tokens=3, output_tokens=2)


@pytest.mark.parametrize(
    ("events", "retryable"),
    [
        (
            [*TEXT_EVENTS[:3], error_event("overloaded_error")],
            True,
        ),
        (
            [*TEXT_EVENTS[:3], error_event("invalid_request_error")],
            False,
        ),
        (TEXT_EVENTS[:5], True),  # clean EOF without message_stop
    ],
)
async def test_stream_errors_from_own_server(
    events: list[tuple[str, dict[str, Any]]], retryable: bool
) -> None:
    runner, url = await serve_bytes(sse(events), 7)
    p = AnthropicProvider("anth", url, API_KEY)
    try:
        stream = await p.chat_stream(body(), TARGET, timeout=5, idle_timeout=5)
        with pytest.raises(StreamBrokenError) as info:
            await collect(stream)
    finally:
        await p.aclose()
        await runner.cleanup()
    assert info.value.retryable is retryable
    assert_clean(info.value)


async def test_connections_are_made_lazily_reused_and_closed(mock: MockUpstream) -> None:
    """The pool exists only after first use; a complete answer and a stream read to its end
    both leave their connection for the next call (one connection serves both); aclose
    closes it."""
    p = AnthropicProvider("anth", mock.base_url, API_KEY)
    assert p._pool._pool is None
    await p.chat(body(), TARGET, timeout=5)
    pool = p._pool._pool
    assert pool is not None and len(pool._idle) == 1
    first = pool._idle[0]
    await collect(await p.chat_stream(body(), TARGET, timeout=5, idle_timeout=5))
    for _ in range(50):  # a released stream hands its connection back when its last bytes land
        if pool._idle:
            break
        await asyncio.sleep(0.01)
    assert pool._idle == [first]
    await p.aclose()
    assert first.closed and p._pool._pool is None
