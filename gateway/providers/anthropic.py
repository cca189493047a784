"""Anthropic's Messages API (``POST /v1/messages``), spoken for OpenAI-shaped requests.

The wire translation is the Anthropic format of ``gateway.protocols``, shared with the inbound
Messages adapter: ``anthropic_outbound`` (requests, complete responses) and
``anthropic_events.StreamTranslator`` (SSE events -> chunks). This module only does HTTP:
headers, timeouts, SSE framing and the mapping of failures to the error tree (through
``providers.http``).
Neither the API key nor the request's content ever appears in an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import orjson

from gateway.core.errors import UpstreamError
from gateway.core.types import ChatResult, RawResult, Target, Usage, usage_from_anthropic
from gateway.protocols.anthropic_events import StreamTranslator
from gateway.protocols.anthropic_outbound import (
    MalformedResponseError,
    add_cache_breakpoints,
    from_anthropic_response,
    to_anthropic_request,
)
from gateway.providers import http
from gateway.providers.h1 import H1Error, H1Stream, LazyPool
from gateway.providers.sse import EventStream, TypedEventStream

_TRANSPORT_ERRORS = (H1Error, TimeoutError, OSError)


class AnthropicProvider:
    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        headers: Mapping[str, str] | None = None,
        anthropic_version: str = "2023-06-01",
        *,
        auto_cache_control: bool = False,
    ) -> None:
        self.name = name
        self._auto_cache = auto_cache_control
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._pool = LazyPool(base_url)
        self._headers = {
            **dict(headers or {}),
            "anthropic-version": anthropic_version,
            "content-type": "application/json",
        }
        if api_key:
            self._headers["x-api-key"] = api_key

    def __repr__(self) -> str:
        return f"AnthropicProvider(name={self.name!r}, url={self._url!r})"

    def _request(self, body: dict[str, Any], target: Target, *, stream: bool) -> dict[str, Any]:
        request = to_anthropic_request(body, target.upstream_model, stream=stream)
        return add_cache_breakpoints(request) if self._auto_cache else request

    def _headers_for(self, stream: bool) -> dict[str, str]:
        return {**self._headers, "accept": "text/event-stream" if stream else "application/json"}

    async def _post_json(
        self, payload: bytes, headers: Mapping[str, str], timeout: float, path: str = "/v1/messages"
    ) -> Any:
        """POST ``payload``; the parsed JSON body of a 200, or the error tree's error."""
        pool = self._pool.get()
        try:
            resp = await pool.post(path, payload, headers, http.MAX_RESPONSE_BYTES, timeout)
        except _TRANSPORT_ERRORS as exc:
            raise http.transport_error(self.name, exc) from None
        if resp.status != 200:
            raise http.status_error(self.name, resp.status, resp.headers, resp.body or b"")
        if resp.body is None:
            raise http.bad_response(self.name, f"body larger than {http.MAX_RESPONSE_BYTES} bytes")
        ctype = resp.headers.get("content-type", "")
        if "json" not in ctype:
            raise http.bad_response(self.name, f"content-type {ctype or 'missing'}")
        try:
            return orjson.loads(resp.body)
        except orjson.JSONDecodeError:
            raise http.bad_response(self.name, "body is not JSON") from None

    async def _open_stream(self, payload: bytes, headers: Mapping[str, str], timeout: float) -> H1Stream:
        """POST ``payload`` and return the accepted SSE response (status 200 within ``timeout``)."""
        resp: H1Stream | None = None
        try:
            async with asyncio.timeout(timeout):
                resp = await self._pool.get().open("/v1/messages", payload, headers)
                if resp.status != 200:
                    raw = await resp.read_body(http.MAX_ERROR_BYTES)
                    resp.release()
                    raise http.status_error(self.name, resp.status, resp.headers, raw or b"")
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                raise http.bad_response(self.name, f"stream content-type {ctype or 'missing'}")
        except BaseException as exc:
            if resp is not None:
                resp.close()
            if isinstance(exc, _TRANSPORT_ERRORS):
                raise http.transport_error(self.name, exc) from None
            raise
        return resp

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        payload = orjson.dumps(self._request(body, target, stream=False))
        parsed = await self._post_json(payload, self._headers_for(False), timeout)
        try:
            return from_anthropic_response(parsed, target.upstream_model)
        except MalformedResponseError as exc:
            raise http.bad_response(self.name, str(exc)) from None

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> AnthropicStream:
        payload = orjson.dumps(self._request(body, target, stream=True))
        resp = await self._open_stream(payload, self._headers_for(True), timeout)
        translator = StreamTranslator(target.upstream_model, provider=self.name)
        return AnthropicStream(self.name, resp, translator, idle_timeout)

    # -------------------------------------------------------------- Messages in, Messages out
    def _pass_headers(self, stream: bool, forwarded: Mapping[str, str]) -> dict[str, str]:
        """Our headers plus the client's ``anthropic-version`` / ``anthropic-beta`` (never its key)."""
        out = self._headers_for(stream)
        for name in ("anthropic-version", "anthropic-beta"):
            if forwarded.get(name):
                out[name] = forwarded[name]
        return out

    async def messages(
        self, body: dict[str, Any], target: Target, timeout: float, forwarded: Mapping[str, str]
    ) -> RawResult:
        """Pass-through: the client's Messages body with only ``model`` replaced."""
        payload = orjson.dumps({**body, "model": target.upstream_model})
        parsed = await self._post_json(payload, self._pass_headers(False, forwarded), timeout)
        if not isinstance(parsed, dict) or parsed.get("type") != "message":
            raise http.bad_response(self.name, "not an Anthropic message object")
        return RawResult(parsed, http.checked_usage(usage_from_anthropic(parsed.get("usage"))) or Usage())

    async def count_tokens(
        self, body: dict[str, Any], target: Target, timeout: float, forwarded: Mapping[str, str]
    ) -> int | None:
        """``/v1/messages/count_tokens`` upstream: the provider's own count of the body."""
        payload = orjson.dumps({**body, "model": target.upstream_model})
        headers = self._pass_headers(False, forwarded)
        parsed = await self._post_json(payload, headers, timeout, "/v1/messages/count_tokens")
        count = parsed.get("input_tokens") if isinstance(parsed, dict) else None
        return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None

    async def messages_stream(
        self,
        body: dict[str, Any],
        target: Target,
        timeout: float,
        idle_timeout: float,
        forwarded: Mapping[str, str],
    ) -> MessagesStream:
        """Pass-through stream: the upstream's SSE events, data bytes untouched."""
        payload = orjson.dumps({**body, "model": target.upstream_model})
        resp = await self._open_stream(payload, self._pass_headers(True, forwarded), timeout)
        return MessagesStream(self.name, resp, idle_timeout)

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        raise UpstreamError(
            f"upstream '{self.name}' (Anthropic) has no legacy completions endpoint",
            retryable=False,
            code="unsupported",
        )

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        raise UpstreamError(
            f"upstream '{self.name}' (Anthropic) has no embeddings endpoint",
            retryable=False,
            code="unsupported",
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class AnthropicStream(EventStream):
    """An accepted Anthropic SSE stream, translated into OpenAI chunk dicts."""

    def __init__(
        self, provider: str, resp: H1Stream, translator: StreamTranslator, idle_timeout: float
    ) -> None:
        super().__init__(provider, resp, idle_timeout)
        self._translator = translator

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        if self._gen is None:
            self._gen = self._iterate()
        return self._gen

    async def _iterate(self) -> AsyncGenerator[dict[str, Any], None]:
        translator = self._translator
        try:
            async with contextlib.aclosing(self._events()) as events:
                async for event, data in events:
                    chunks = translator.feed(event, self._parse(data))
                    self.usage = translator.usage
                    for chunk in chunks:
                        yield chunk
                    if translator.finished:
                        return
            raise self._broken("ended before message_stop")
        finally:
            self.usage = translator.usage
            if translator.finished:
                self._resp.release()
            else:
                self._resp.close()


class MessagesStream(TypedEventStream):
    """An accepted Anthropic SSE stream relayed as it is: iterating yields (event name, data
    bytes, parsed data). ``usage`` follows message_start and message_delta; an ``error``
    event, a malformed event or an end before message_stop raises StreamBrokenError."""

    LAST = "message_stop"

    def __init__(self, provider: str, resp: H1Stream, idle_timeout: float) -> None:
        super().__init__(provider, resp, idle_timeout)
        self._raw_usage: dict[str, Any] = {}
        self.stop_reason: str | None = None

    def _error(self, data: dict[str, Any]) -> str | None:
        err = data.get("error")
        return str(err.get("type")) if isinstance(err, dict) else None

    def _note(self, kind: str, data: dict[str, Any]) -> bool:
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self._raw_usage.update(data["message"].get("usage") or {})
        elif kind == "message_delta":
            self._raw_usage.update(data.get("usage") or {})
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
        else:
            return kind == "message_stop"
        self.usage = http.checked_usage(usage_from_anthropic(self._raw_usage))
        return False
