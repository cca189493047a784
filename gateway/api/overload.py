"""Bounded admission: a gateway past its capacity answers at once instead of queueing.

Every HTTP request except the probes and /metrics counts as in flight from its first byte
until its response (a whole stream included) is over. When ``server.max_in_flight`` requests
are already in flight, a new one gets an immediate OpenAI-shaped 503 with ``Retry-After``:
the work waiting inside one process, and the memory it holds, stay bounded, and the
liveness probe keeps answering so an orchestrator does not kill a busy but healthy gateway.
The limit is per worker process and read from the running policy (hot reloads apply)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.core.errors import OverloadedError

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def shed_body() -> bytes:
    error = OverloadedError("The gateway is at capacity; retry after the time in the Retry-After header")
    return orjson.dumps(error.to_body())


class AdmissionGate:
    """Pure-ASGI wrapper around the application that counts and bounds requests in flight."""

    def __init__(self, app: ASGIApp, state_owner: Any) -> None:
        self.app = app
        self._owner = state_owner  # the FastAPI app: its ``state.sy`` appears in the lifespan
        self.in_flight = 0
        self.shed = 0
        self._body = shed_body()
        self._sy: Any = None

    @property
    def state(self) -> Any:
        return self._owner.state

    def _limits(self) -> tuple[int | None, int, Any]:
        """(max in flight or None for no limit, Retry-After seconds, metrics or None)."""
        sy = self._sy
        if sy is None:  # set once at start-up and never replaced: look it up until it is there
            sy = self._sy = getattr(self._owner.state, "sy", None)
            if sy is None:
                return None, 1, None
        svc = sy.services
        server = svc.policy.server
        return server.max_in_flight, server.overload_retry_after_s, svc.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        limit, retry_after, metrics = self._limits()
        if limit is not None and self.in_flight >= limit:
            self.shed += 1
            if metrics is not None:
                metrics.shed.labels("in_flight").inc()
            await self._refuse(send, retry_after)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, send: Send, retry_after: int) -> None:
        # The request body is left unread; the server discards it, the connection stays open.
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(self._body)).encode()),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self._body})
