"""Every error leaves as OpenAI-shaped JSON rendered from the one error tree (gateway/core/
errors.py); no traceback ever reaches a client."""

from __future__ import annotations

import logging
import math

import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway.core.errors import (
    BadRequestError,
    InternalError,
    MethodNotAllowedError,
    SwitchyardError,
    UnknownPathError,
)
from gateway.protocols import anthropic_messages

log = logging.getLogger("switchyard")
REQUEST_ID = "switchyard.request_id"  # ASGI scope key (cheaper than starlette's request.state)


def request_id_of(request: Request) -> str | None:
    rid = request.scope.get(REQUEST_ID)
    return rid if isinstance(rid, str) else None


def error_headers(exc: SwitchyardError, request_id: str | None = None) -> dict[str, str]:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
    if request_id:
        headers["x-request-id"] = request_id
    if exc.client_retry is not None:
        headers["x-should-retry"] = "true" if exc.client_retry else "false"
    return headers


def error_response(exc: SwitchyardError, request_id: str | None = None) -> Response:
    return Response(
        orjson.dumps(exc.to_body()),
        status_code=exc.status,
        headers=error_headers(exc, request_id),
        media_type="application/json",
    )


def error_bytes(error: SwitchyardError, path: str) -> bytes:
    """``error``'s body in the shape of the protocol ``path`` speaks, for answers sent before
    any handler (the admission gate, a gateway still starting): Anthropic's on /v1/messages."""
    if path.startswith("/v1/messages"):
        return orjson.dumps(anthropic_messages.error_body(error))
    return orjson.dumps(error.to_body())


def internal_error_response(request: Request, exc: Exception) -> Response:
    """A bug: log it (redacted by the log filter) and tell the client no more than an id."""
    request_id = request_id_of(request)
    log.error("unhandled error in %s (request %s)", request.url.path, request_id, exc_info=exc)
    return error_response(InternalError(f"Internal gateway error (request id {request_id})"))


def _http_error(request: Request, exc: StarletteHTTPException) -> SwitchyardError:
    if exc.status_code == 404:
        return UnknownPathError(f"Unknown path: {request.method} {request.url.path}")
    if exc.status_code == 405:
        return MethodNotAllowedError(f"Method {request.method} is not allowed on {request.url.path}")
    error = BadRequestError(str(exc.detail)) if exc.status_code < 500 else InternalError(str(exc.detail))
    error.status, error.code = exc.status_code, None
    return error


def install_error_handlers(app: FastAPI) -> None:
    async def on_switchyard(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SwitchyardError)
        return error_response(exc, request_id_of(request))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(_http_error(request, exc))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return internal_error_response(request, exc)

    app.add_exception_handler(SwitchyardError, on_switchyard)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
