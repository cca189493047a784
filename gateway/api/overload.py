"""Bounded admission: a gateway past its capacity answers at once instead of queueing.

Two bounds, per worker process, read from the running policy (hot reloads apply):

* ``server.max_in_flight``: requests being worked on, from the moment their body has arrived
  whole (a request without a body: from its first byte) until their response, a whole
  stream included, is over. These are the requests that hold model calls, reservations and
  buffers.
* ``server.max_body_reads``: requests whose body is still arriving. A client that sends its
  headers and then trickles (or never finishes) its body costs a socket and the bytes so far,
  not a model call, so it is counted here and not against ``max_in_flight``; the handler cuts
  it with a 408 after ``server.body_timeout_s``. Slow bodies therefore cannot lock out clients
  whose bodies arrive at once.

Past either bound a new request gets an immediate OpenAI-shaped 503 with ``Retry-After``. A
request whose body completes while ``max_in_flight`` is full gets the same 503, raised from
``receive`` as an ``OverloadedError`` so the handler renders it in its own protocol's shape.
The probes and /metrics are never counted: the liveness probe keeps answering so an
orchestrator does not kill a busy but healthy gateway."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api import seen
from gateway.api.errors import error_bytes
from gateway.api.starting import StartGate
from gateway.core.errors import OverloadedError

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
SHED_MESSAGE = "The gateway is at capacity; retry after the time in the Retry-After header"


def shed_body(path: str = "/v1/chat/completions") -> bytes:
    return error_bytes(OverloadedError(SHED_MESSAGE), path)


def _has_body(scope: Scope) -> bool:
    """Whether the request announces a body (a non-zero Content-Length, or chunked)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


class AdmissionGate:
    """Pure-ASGI wrapper around the application that counts and bounds requests in flight and
    requests still reading their body."""

    def __init__(self, app: ASGIApp, state_owner: Any) -> None:
        self.app = app
        self._owner = state_owner  # the FastAPI app: its ``state.sy`` appears in the lifespan
        self.in_flight = 0
        self.reading = 0
        self.shed = 0
        self._body = shed_body()
        self._messages_body = shed_body("/v1/messages")
        self._sy: Any = None
        self.start_gate: StartGate | None = None  # set while a slow start-up runs on

    @property
    def state(self) -> Any:
        return self._owner.state

    def _limits(self) -> tuple[int | None, int | None, int, Any]:
        """(max in flight, max body reads (None: no limit), Retry-After seconds, metrics)."""
        sy = self._sy
        if sy is None:  # set once at start-up and never replaced: look it up until it is there
            sy = self._sy = getattr(self._owner.state, "sy", None)
            if sy is None:
                return None, None, 1, None
        svc = sy.services
        server = svc.policy.server
        return server.max_in_flight, server.max_body_reads, server.overload_retry_after_s, svc.metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.start_gate is not None and scope["type"] == "http":
            await self.start_gate.answer(scope, send)
            return
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        limit, read_limit, retry_after, metrics = self._limits()
        if limit is not None and self.in_flight >= limit:
            await self._refuse(scope, send, retry_after, metrics, "in_flight")
            return
        if not _has_body(scope):
            self.in_flight += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
            return
        if read_limit is not None and self.reading >= read_limit:
            await self._refuse(scope, send, retry_after, metrics, "body_reads")
            return
        self.reading += 1
        admitted = False  # counted in ``reading`` until the body is whole, then in ``in_flight``

        async def counted_receive() -> Message:
            nonlocal admitted
            message = await receive()
            if admitted or message["type"] != "http.request" or message.get("more_body", False):
                return message
            if limit is not None and self.in_flight >= limit:
                self.shed += 1
                if metrics is not None:
                    metrics.shed.labels("in_flight").inc()
                raise OverloadedError(SHED_MESSAGE, retry_after=retry_after)
            self.reading -= 1
            self.in_flight += 1
            admitted = True
            return message

        try:
            await self.app(scope, counted_receive, send)
        finally:
            if admitted:
                self.in_flight -= 1
            else:
                self.reading -= 1

    async def _refuse(self, scope: Scope, send: Send, retry_after: int, metrics: Any, reason: str) -> None:
        # The request body is left unread; the server discards it, the connection stays open.
        self.shed += 1
        if metrics is not None:
            metrics.shed.labels(reason).inc()
            seen.shed(self._sy.services, scope["path"])
        body = self._messages_body if scope["path"].startswith("/v1/messages") else self._body
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
