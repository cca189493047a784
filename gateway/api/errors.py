"""Every error leaves as OpenAI-shaped JSON; no traceback ever reaches a client."""

from __future__ import annotations

import logging
import math

import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from gateway.core.errors import SwitchyardError

log = logging.getLogger("switchyard")
REQUEST_ID = "switchyard.request_id"  # ASGI scope key (cheaper than starlette's request.state)


def request_id_of(request: Request) -> str | None:
    rid = request.scope.get(REQUEST_ID)
    return rid if isinstance(rid, str) else None


def error_response(exc: SwitchyardError, request_id: str | None = None) -> Response:
    headers = {}
    if exc.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
    if request_id:
        headers["x-request-id"] = request_id
    return Response(
        orjson.dumps(exc.to_body()), status_code=exc.status, headers=headers, media_type="application/json"
    )


def _http_error(status: int, message: str, code: str | None) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def internal_error_response(request: Request, exc: Exception) -> Response:
    """A bug: log it (redacted by the log filter) and tell the client no more than an id."""
    request_id = request_id_of(request)
    log.error("unhandled error in %s (request %s)", request.url.path, request_id, exc_info=exc)
    return _http_error(500, f"Internal gateway error (request id {request_id})", "internal_error")


def install_error_handlers(app: FastAPI) -> None:
    async def on_switchyard(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SwitchyardError)
        return error_response(exc, request_id_of(request))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return _http_error(404, f"Unknown path: {request.method} {request.url.path}", "unknown_url")
        if exc.status_code == 405:
            return _http_error(
                405, f"Method {request.method} is not allowed on {request.url.path}", "method_not_allowed"
            )
        return _http_error(exc.status_code, str(exc.detail), None)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return internal_error_response(request, exc)

    app.add_exception_handler(SwitchyardError, on_switchyard)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
