"""An OpenAI Responses API event stream, relayed as it is: each typed event (``event:`` +
``data:``) comes out as (event type, data bytes as sent, parsed data); the usage and the
final Response object are read from the terminal event."""

from __future__ import annotations

from typing import Any

from gateway.core.types import usage_from_responses
from gateway.providers import http
from gateway.providers.h1 import H1Stream
from gateway.providers.sse import TypedEventStream

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesEventStream(TypedEventStream):
    """Iterating yields (event type, data bytes, parsed data) up to and including the terminal
    event; ``response`` and ``usage`` are set from it. An ``error`` event, a malformed event
    or an end before a terminal event raises StreamBrokenError."""

    LAST = "response.completed"

    def __init__(self, provider: str, resp: H1Stream, idle_timeout: float) -> None:
        super().__init__(provider, resp, idle_timeout)
        self.response: dict[str, Any] | None = None

    def _error(self, data: dict[str, Any]) -> str | None:
        err = data.get("error")
        code = data.get("code") or (err.get("code") if isinstance(err, dict) else None)
        return str(code) if code else None

    def _note(self, kind: str, data: dict[str, Any]) -> bool:
        if kind not in TERMINAL:
            return False
        response = data.get("response")
        if not isinstance(response, dict):
            raise self._broken(f"sent {kind} without a response")
        self.response = response
        self.usage = http.checked_usage(usage_from_responses(response.get("usage")))
        return True
