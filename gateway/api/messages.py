"""Anthropic Messages in: ``POST /v1/messages`` (also with ``?beta=true``) and
``POST /v1/messages/count_tokens``. Thin handlers: admit like the OpenAI routes (the same key
as ``x-api-key`` or Bearer), validate, call the pipeline with the Messages adapter
(gateway/flow/adapters/messages.py); every error leaves in
Anthropic's shape (``{"type": "error", "error": {...}}``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.errors import error_headers, request_id_of
from gateway.api.openapi import openapi_extra
from gateway.api.routes import admitted, render
from gateway.core.errors import SwitchyardError
from gateway.flow import count_tokens as counting
from gateway.flow import pipeline
from gateway.flow.adapters.messages import Messages
from gateway.protocols.anthropic_messages import CountTokensRequest, MessagesRequest, error_body

router = APIRouter()


def _error(exc: SwitchyardError, request: Request) -> Response:
    body = orjson.dumps(error_body(exc))
    headers = error_headers(exc, request_id_of(request))
    return Response(body, status_code=exc.status, headers=headers, media_type="application/json")


async def _guarded(request: Request, handle: Callable[[Request], Awaitable[Response]]) -> Response:
    try:
        return await handle(request)
    except SwitchyardError as exc:
        return _error(exc, request)


async def _messages(request: Request) -> Response:
    svc, ex, data, headers = await admitted(request, MessagesRequest)
    return render(await pipeline.serve(svc, Messages(svc, data, headers), ex))


async def _count_tokens(request: Request) -> Response:
    svc, ex, data, headers = await admitted(request, CountTokensRequest)
    count, out = await counting.counted(svc, data, headers, ex)
    return Response(orjson.dumps(count), headers=out, media_type="application/json")


ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": ANTHROPIC_ERROR}}}
    for status, text in ((400, "A bad field (the message names it)"), (401, "Missing or unknown key"),
                         (404, "Unknown model or route"), (429, "Rate limited"), (502, "Upstream failure"))
}  # fmt: skip


@router.post("/v1/messages", responses=ERRORS, openapi_extra=openapi_extra(MessagesRequest, streams=True))
async def messages(request: Request) -> Response:
    return await _guarded(request, _messages)


@router.post("/v1/messages/count_tokens", responses=ERRORS, openapi_extra=openapi_extra(CountTokensRequest))
async def count_tokens(request: Request) -> Response:
    return await _guarded(request, _count_tokens)


HOT_ROUTES = {("POST", "/v1/messages"): messages}
