"""An OpenAI Responses API event stream, relayed as it is: each typed event (``event:`` +
``data:``) comes out as (event type, data bytes as sent, parsed data); the usage and the
final Response object are read from the terminal event."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp

from gateway.core.types import usage_from_responses
from gateway.providers import http
from gateway.providers.sse import EventStream

NO_CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None)
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesEventStream(EventStream):
    """Iterating yields (event type, data bytes, parsed data) up to and including the terminal
    event; ``response`` and ``usage`` are set from it. An ``error`` event, a malformed event
    or an end before a terminal event raises StreamBrokenError."""

    def __init__(self, provider: str, resp: aiohttp.ClientResponse, idle_timeout: float) -> None:
        super().__init__(provider, resp, idle_timeout)
        self.response: dict[str, Any] | None = None

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes, dict[str, Any]]]:
        if self._gen is None:
            self._gen = self._iterate()
        return self._gen

    async def _iterate(self) -> AsyncGenerator[tuple[str, bytes, dict[str, Any]], None]:
        finished = False
        try:
            async with contextlib.aclosing(self._events()) as events:
                async for event, raw in events:
                    data = self._parse(raw)
                    kind = data.get("type") if isinstance(data.get("type"), str) else event
                    if kind == "error":
                        err = data.get("error")
                        code = data.get("code") or (err.get("code") if isinstance(err, dict) else None)
                        raise self._broken(f"sent an error event ({code or 'unknown'})")
                    if kind in TERMINAL:
                        response = data.get("response")
                        if not isinstance(response, dict):
                            raise self._broken(f"sent {kind} without a response")
                        self.response = response
                        self.usage = http.checked_usage(usage_from_responses(response.get("usage")))
                        finished = True
                    yield str(kind), raw, data
                    if finished:
                        return
            raise self._broken("ended before response.completed")
        finally:
            if finished:
                self._resp.release()
            else:
                self._resp.close()
