"""The one protocol every upstream API module implements.

A provider receives the OpenAI-shaped request body (``body``; its ``model`` field is what the
client sent and must be replaced with ``target.upstream_model``), speaks its vendor's wire
format privately, and returns OpenAI-shaped results. It maps every failure to the error tree
in ``gateway.core.errors`` in one place:

- connect error / refused            -> UpstreamError(retryable=True, code="upstream_connect_error")
- timeout                            -> UpstreamTimeoutError
- HTTP 429                           -> UpstreamRateLimitedError(retry_after=<Retry-After seconds>)
- HTTP 5xx                           -> UpstreamError(upstream_status=..., retryable=True)
- HTTP 401/403/404                   -> UpstreamError(retryable=False)  (config problem: next target)
- HTTP other 4xx                     -> UpstreamRejectedError (client's fault: no retry, no fallback)
- non-JSON / malformed body          -> UpstreamError(retryable=True, code="upstream_bad_response")

Error messages never contain the provider key or the request's content.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.core.types import ChatResult, ChatStream, RawResult, Target


class Provider(Protocol):
    name: str

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        """Non-streaming chat completion. ``timeout`` bounds the whole call."""
        ...

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> ChatStream:
        """Open a stream. Returns once the upstream accepted (status 200 and headers within
        ``timeout``); each later chunk must arrive within ``idle_timeout``. The provider always
        asks the upstream for usage, whatever the client asked."""
        ...

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        """Legacy /v1/completions (non-streaming). Providers without it raise
        UpstreamError(retryable=False, code="unsupported")."""
        ...

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        """/v1/embeddings. Providers without it raise UpstreamError(retryable=False, code="unsupported")."""
        ...

    async def aclose(self) -> None:
        """Release connections (called once at shutdown)."""
        ...
