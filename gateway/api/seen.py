"""Every request the flow does not record itself still leaves its access-log line and its
metric sample: the stored-response, Files, Batch, feedback, admin and dashboard endpoints
(their answers are not metered requests, so they have no ledger row), and the 503s the
admission gate sheds. The hot routes, /v1/models and count_tokens are recorded by the flow
(gateway/flow/metering.py, access_log); a request refused at authentication by
``state.unauthenticated``. Health checks and /metrics scrapes are not logged (a probe every
few seconds would drown the log); they are not requests of any tenant."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import REQUEST_ID
from gateway.flow import access_log

LOGGED = "switchyard.logged"  # ASGI scope key: this request's line is written already
TENANT = "switchyard.tenant"  # ASGI scope key: the authenticated tenant, once known
# Path prefixes -> the endpoint label (a bounded set, longest prefix first).
PREFIXES = (
    ("/v1/messages/batches", "message_batches"),
    ("/v1/responses/", "responses_store"),
    ("/v1/batches", "batches"),
    ("/v1/files", "files"),
    ("/v1/feedback", "feedback"),
    ("/admin/", "admin"),
    ("/dashboard", "dashboard"),
    ("/v1/", "other"),
)
SKIPPED = frozenset({"/healthz", "/readyz", "/metrics", "/favicon.ico"})


def endpoint_of(path: str) -> str | None:
    """The endpoint label of a path this module logs (None: not logged here: a probe, or a
    path the flow records itself)."""
    if path in SKIPPED or path in access_log.ENDPOINTS or path.startswith("/v1/models/"):
        return None
    for prefix, label in PREFIXES:
        if path.startswith(prefix):
            return label
    return None


async def logged(app: ASGIApp, services: Any, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` for one request and leave its line and metric sample once it answered."""
    endpoint = endpoint_of(scope["path"])
    if endpoint is None or services is None:
        await app(scope, receive, send)
        return
    started = time.perf_counter()
    status = 500  # until the response starts: an exception that escaped is a 500

    async def watched(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        await send(message)

    try:
        await app(scope, receive, watched)
    finally:
        if not scope.get(LOGGED):
            note(services, scope, endpoint, status, time.perf_counter() - started)


def note(services: Any, scope: Scope, endpoint: str, status: int, seconds: float) -> None:
    outcome = "ok" if status < 400 else "error"
    services.metrics.requests.labels(endpoint, "", "none", "none", outcome, "off").inc()
    access_log.other(
        scope.get(REQUEST_ID) or "-",
        scope.get(TENANT) or "-",
        endpoint,
        status,
        seconds,
        enabled=services.policy.server.access_log,
    )


def label(path: str) -> str:
    """The endpoint label of any request path (the flow's, or this module's)."""
    return access_log.ENDPOINTS.get(path) or endpoint_of(path) or "other"


def shed(services: Any, path: str) -> None:
    """A 503 the admission gate answered before any handler ran (overloaded)."""
    endpoint = label(path)
    services.metrics.requests.labels(endpoint, "", "none", "none", "error", "off").inc()
    enabled = services.policy.server.access_log
    access_log.refused("-", endpoint, 503, "overloaded", 0.0, enabled=enabled)
