"""OpenAI and every OpenAI-compatible API (vLLM, Azure-style proxies, local servers).

The request body goes through unchanged except ``model`` (set to the upstream id) and, for
streams, ``stream_options.include_usage`` (always on, so every stream is metered). Providers
that speak the Responses API (policy ``providers.X.responses``) also take ``/responses``
bodies as they are (openai_responses.py reads their event streams)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from gateway.core.errors import StreamBrokenError, UpstreamError
from gateway.core.types import ChatResult, RawResult, Target, Usage, usage_from_openai, usage_from_responses
from gateway.providers import http
from gateway.providers.h1 import H1Error, H1Stream, LazyPool
from gateway.providers.openai_responses import ResponsesEventStream
from gateway.providers.sse import MAX_EVENT_BYTES


class OpenAICompatProvider:
    def __init__(
        self, name: str, base_url: str, api_key: str | None, headers: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self._base = base_url.rstrip("/")
        self._headers = {"content-type": "application/json", **dict(headers or {})}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._pool = LazyPool(self._base)

    def __repr__(self) -> str:
        return f"OpenAICompatProvider(name={self.name!r}, base_url={self._base!r})"

    async def _post_json(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        pool = self._pool.get()
        try:
            resp = await pool.post(path, orjson.dumps(body), self._headers, http.MAX_RESPONSE_BYTES, timeout)
        except (H1Error, TimeoutError, OSError) as exc:
            raise http.transport_error(self.name, exc) from None
        if resp.status != 200:
            raise http.status_error(self.name, resp.status, resp.headers, resp.body or b"")
        raw = resp.body
        if raw is None:
            raise http.bad_response(self.name, f"body larger than {http.MAX_RESPONSE_BYTES} bytes")
        ctype = resp.headers.get("content-type", "")
        if "json" not in ctype:
            raise http.bad_response(self.name, f"content-type {ctype or 'missing'}")
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise http.bad_response(self.name, "body is not JSON") from None
        if not isinstance(parsed, dict):
            raise http.bad_response(self.name, "body is not a JSON object")
        return parsed

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        out = dict(body)
        out["model"] = target.upstream_model
        out.pop("stream_options", None)
        out["stream"] = False
        parsed = await self._post_json("/chat/completions", out, timeout)
        if not isinstance(parsed.get("choices"), list):
            raise http.bad_response(self.name, "no choices")
        return ChatResult(
            body=parsed, usage=http.checked_usage(usage_from_openai(parsed.get("usage"))) or Usage()
        )

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        out = dict(body)
        out["model"] = target.upstream_model
        parsed = await self._post_json("/completions", out, timeout)
        return RawResult(
            body=parsed, usage=http.checked_usage(usage_from_openai(parsed.get("usage"))) or Usage()
        )

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        out = dict(body)
        out["model"] = target.upstream_model
        parsed = await self._post_json("/embeddings", out, timeout)
        if not isinstance(parsed.get("data"), list):
            raise http.bad_response(self.name, "no data")
        return RawResult(
            body=parsed, usage=http.checked_usage(usage_from_openai(parsed.get("usage"))) or Usage()
        )

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> _OpenAIStream:
        out = dict(body)
        out["model"] = target.upstream_model
        out["stream"] = True
        opts = out.get("stream_options")
        out["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        resp = await self._post_stream("/chat/completions", orjson.dumps(out), timeout)
        return _OpenAIStream(self.name, resp, idle_timeout)

    async def _post_stream(self, path: str, payload: bytes, timeout: float) -> H1Stream:
        """POST ``payload`` and return the accepted SSE response (status 200 within ``timeout``)."""
        resp: H1Stream | None = None
        try:
            async with asyncio.timeout(timeout):
                resp = await self._pool.get().open(path, payload, self._headers)
                if resp.status != 200:
                    raw = await resp.read_body(http.MAX_ERROR_BYTES)
                    resp.release()
                    raise http.status_error(self.name, resp.status, resp.headers, raw or b"")
        except (H1Error, TimeoutError, OSError) as exc:
            if resp is not None:
                resp.close()
            raise http.transport_error(self.name, exc) from None
        except BaseException:
            if resp is not None:
                resp.close()
            raise
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            resp.close()
            raise http.bad_response(self.name, f"stream content-type {ctype or 'missing'}")
        return resp

    # -------------------------------------------------------------- Responses in, Responses out
    async def responses(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        """Pass-through: the client's Responses body with only ``model`` replaced."""
        parsed = await self._post_json("/responses", {**body, "model": target.upstream_model}, timeout)
        if parsed.get("object") != "response":
            raise http.bad_response(self.name, "not a Response object")
        return RawResult(parsed, http.checked_usage(usage_from_responses(parsed.get("usage"))) or Usage())

    async def responses_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> ResponsesEventStream:
        """Pass-through stream: the upstream's typed events, data bytes untouched."""
        payload = orjson.dumps({**body, "model": target.upstream_model})
        resp = await self._post_stream("/responses", payload, timeout)
        return ResponsesEventStream(self.name, resp, idle_timeout)

    async def aclose(self) -> None:
        await self._pool.aclose()


class _OpenAIStream:
    """Server-sent events from an OpenAI-compatible upstream, parsed into chunk dicts."""

    def __init__(self, provider: str, resp: H1Stream, idle_timeout: float) -> None:
        self._provider = provider
        self._resp = resp
        self._idle = idle_timeout
        self.usage: Usage | None = None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    def _broken(self, what: str) -> StreamBrokenError:
        return StreamBrokenError(f"upstream '{self._provider}' {what}")

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        resp = self._resp
        finished = False
        try:
            while True:
                try:
                    line = await resp.readline(MAX_EVENT_BYTES, self._idle)
                except H1Error as exc:
                    if exc.kind == "stalled":
                        raise self._broken("stream stalled") from None
                    if exc.kind == "oversized":
                        raise self._broken("sent an oversized event") from None
                    raise self._broken(f"stream broke: {exc.kind}") from None
                if not line:
                    raise self._broken("stream ended without [DONE]")
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event:/id: lines
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    finished = True
                    return
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise self._broken("sent a malformed event") from None
                if not isinstance(chunk, dict):
                    raise self._broken("sent a malformed event")
                if "error" in chunk and "choices" not in chunk:
                    raise UpstreamError(f"upstream '{self._provider}' reported an error mid-stream")
                usage = chunk.get("usage")
                if usage:
                    self.usage = http.checked_usage(usage_from_openai(usage))
                yield chunk
        finally:
            if finished:
                resp.release()
            else:
                resp.close()

    async def aclose(self) -> None:
        self._resp.close()
