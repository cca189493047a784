"""Thin route handlers: authenticate, parse, call the pipeline, render."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from gateway.api import admin
from gateway.api.auth import require_admin
from gateway.api.sse import SSEResponse
from gateway.api.state import AppState, wanted_headers
from gateway.api.wire import (
    ERROR_RESPONSES,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    openapi_extra,
    validate,
)
from gateway.core.errors import BadRequestError, PayloadTooLargeError
from gateway.core.types import ChatRequest, RequestContext
from gateway.pipeline import Reply

router = APIRouter()

JSON = "application/json"


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.sy
    return state


async def _json_body(request: Request, limit: int, length: str | None) -> Any:
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"Request body of {length} bytes is over the limit of {limit} bytes")
    if length is not None and length.isdigit():
        raw = await request.body()
    else:
        parts: list[bytes] = []
        size = 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise PayloadTooLargeError(f"Request body is over the limit of {limit} bytes")
            parts.append(part)
        raw = b"".join(parts)
    if not raw:
        raise BadRequestError("The request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequestError(
            "We could not parse the JSON body of your request: it is not valid JSON (UTF-8)"
        ) from None


def _render(reply: Reply) -> Response:
    if reply.stream is not None:
        headers = {**reply.headers, "cache-control": "no-cache", "x-accel-buffering": "no"}
        return SSEResponse(reply.stream, headers, reply.on_close)
    return Response(reply.body, status_code=reply.status, headers=reply.headers, media_type=JSON)


async def _admitted(
    request: Request, wire: type[BaseModel]
) -> tuple[AppState, RequestContext, dict[str, Any]]:
    """Authenticate, read the body within the size limit, validate it against ``wire``."""
    state = _state(request)
    headers = wanted_headers(request.scope)
    ctx = state.context(request, headers)
    data = await _json_body(
        request, state.pipeline.runtime.policy.server.max_body_bytes, headers.get("content-length")
    )
    validate(wire, data)
    return state, ctx, data


@router.post(
    "/v1/chat/completions",
    responses=ERROR_RESPONSES,
    openapi_extra=openapi_extra(ChatCompletionRequest, streams=True),
)
async def chat_completions(request: Request) -> Response:
    state, ctx, data = await _admitted(request, ChatCompletionRequest)
    opts = data.get("stream_options")
    req = ChatRequest(
        body=data,
        stream=bool(data.get("stream")),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
    )
    return _render(await state.pipeline.chat(req, ctx))


@router.post("/v1/completions", responses=ERROR_RESPONSES, openapi_extra=openapi_extra(CompletionRequest))
async def completions(request: Request) -> Response:
    state, ctx, data = await _admitted(request, CompletionRequest)
    return _render(await state.pipeline.passthrough("completions", data, ctx))


@router.post("/v1/embeddings", responses=ERROR_RESPONSES, openapi_extra=openapi_extra(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    state, ctx, data = await _admitted(request, EmbeddingRequest)
    return _render(await state.pipeline.passthrough("embeddings", data, ctx))


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response:
    state = _state(request)
    ctx = state.context(request, wanted_headers(request.scope))
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": owner}
        for name, owner in state.pipeline.runtime.router.visible_models(ctx.principal)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)


@router.get("/healthz")
async def healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type=JSON)


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    state = _state(request)
    checks = {"policy": True, "ledger": state.ledger.healthy()}
    cache = state.pipeline.runtime.cache
    if cache.backend == "redis":
        checks["redis"] = await cache.ping()
    ok = all(checks.values())
    body = {"status": "ready" if ok else "not_ready", "checks": checks}
    return Response(orjson.dumps(body), status_code=200 if ok else 503, media_type=JSON)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = _state(request)
    state.metrics.ledger_pending.set(state.ledger.pending())
    state.metrics.ledger_outbox.set(state.ledger.outbox_rows())
    for model, breaker_state in state.pipeline.breakers.states().items():
        state.metrics.breaker_open.labels(model).set(1 if breaker_state == "open" else 0)
    await admin.export_metrics(state)  # budget remaining
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.post("/admin/policy/reload")
async def reload_policy(request: Request) -> Response:
    state = _state(request)
    require_admin(request.headers, state.settings.admin_key)
    problems = await state.reload()
    if problems:
        body = {
            "error": {
                "message": "The policy file has errors; the running policy was kept",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_policy",
                "problems": [{"path": p, "message": m} for p, m in problems],
            }
        }
        return Response(orjson.dumps(body), status_code=422, media_type=JSON)
    return Response(orjson.dumps({"status": "reloaded"}), media_type=JSON)


HOT_ROUTES = {
    ("POST", "/v1/chat/completions"): chat_completions,
    ("POST", "/v1/completions"): completions,
    ("POST", "/v1/embeddings"): embeddings,
}
