"""The access log: one INFO line per request, whatever its status, on the "switchyard.access"
logger. A line names the request id, tenant, endpoint, route, the model
asked for and the one that answered, the HTTP status, the error code, the latency and the
cache status; never a key, a prompt or an answer. ``server.access_log: false`` in the policy
turns it off; a log level above INFO silences it at the cost of one level check.

Hot path: one ``isEnabledFor`` check, then one record made and handed to the handlers with lazy
%-arguments (no caller lookup: the line's source is always this module). The line holds no
secret by construction, so ``switchyard serve`` gives this logger its own handler, without the
redacting filter's scan of every character (gateway/api/app.py). The one name a client chose
(the model) is quoted when it holds spaces or control characters, so no client can forge a
line, cut at ``_MAX_NAME`` characters, and masked when it looks like a key."""

from __future__ import annotations

import logging

from gateway.core.redact import redact
from gateway.flow.exchange import Exchange

log = logging.getLogger("switchyard.access")

_FORMAT = "access %s tenant=%s endpoint=%s route=%s model=%s served=%s status=%d error=%s ms=%.1f cache=%s"
_MAX_NAME = 120
# Request paths -> the endpoint label (a bounded set: metrics labels and log fields alike).
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses",
    "/v1/models": "models",
}


def endpoint_of(path: str) -> str:
    return ENDPOINTS.get(path, "other")


def _name(value: str) -> str:
    if not value:
        return "-"
    value = value[:_MAX_NAME]
    if "sk-" in value or len(value) > 48:
        value = redact(value, ())
    return value if value.isprintable() and " " not in value else repr(value)


def _emit(*args: object) -> None:
    log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, _FORMAT, args, None))


def note(ex: Exchange, served: str | None, seconds: float, *, enabled: bool) -> None:
    """The line of a request the flow recorded (served, failed, refused past authentication)."""
    if enabled and log.isEnabledFor(logging.INFO):
        _emit(
            ex.request_id, ex.principal.tenant, ex.endpoint, ex.route or "-",
            _name(ex.requested), served or "-", ex.http_status, ex.error_code or "-",
            seconds * 1000.0, ex.cache,
        )  # fmt: skip


def refused(
    request_id: str, endpoint: str, status: int, code: str | None, seconds: float, *, enabled: bool
) -> None:
    """The line of a request refused before it had a tenant (authentication)."""
    if enabled and log.isEnabledFor(logging.INFO):
        _emit(request_id, "-", endpoint, "-", "-", "-", status, code or "-", seconds * 1000.0, "-")


def other(request_id: str, tenant: str, endpoint: str, status: int, seconds: float, *, enabled: bool) -> None:
    """The line of a request no flow step records (stored responses, files, batches, feedback,
    admin, dashboard, a shed 503): no route or model; its status."""
    if enabled and log.isEnabledFor(logging.INFO):
        code = "-" if status < 400 else f"http_{status}"
        _emit(request_id, tenant, endpoint, "-", "-", "-", status, code, seconds * 1000.0, "-")
