"""Thin route handlers: admit (authenticate, read and validate the body), call the flow, render.

Admission runs here in the handler path rather than in a middleware stack: FastAPI's stack
costs about 0.1 ms a request on one core (see api/fastpath.py)."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from gateway.api.auth import require_admin
from gateway.api.errors import error_response
from gateway.api.openapi import ERROR_RESPONSES, openapi_extra
from gateway.api.sse import SSEResponse
from gateway.api.state import AppState, wanted_headers
from gateway.core.errors import (
    BadRequestError,
    NotConfiguredError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    SwitchyardError,
)
from gateway.flow import access_log, admin, pipeline
from gateway.flow import completions as legacy
from gateway.flow.access_log import endpoint_of
from gateway.flow.adapters.chat import Chat
from gateway.flow.exchange import Exchange
from gateway.flow.reply import Reply
from gateway.flow.services import Services
from gateway.protocols.openai_chat import (
    ChatCompletionRequest,
    EmbeddingRequest,
    check_depth,
    too_deep,
    validate,
)
from gateway.protocols.openai_completions import CompletionRequest

router = APIRouter()

JSON = "application/json"


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.sy
    return state


async def _json_body(request: Request, limit: int, length: str | None) -> Any:
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"Request body of {length} bytes is over the limit of {limit} bytes")
    raw = await _read_body(request, limit)
    if not raw:
        raise BadRequestError("The request body is empty; send a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise too_deep() from None
        raise BadRequestError(
            "We could not parse the JSON body of your request: it is not valid JSON (UTF-8)"
        ) from None
    check_depth(raw, data)  # one nesting limit at the door (protocols.openai_chat.MAX_JSON_DEPTH)
    return data


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, straight from ASGI ``receive`` (Starlette's ``Request.body`` goes
    through an async generator per request), refused past ``limit`` bytes as it arrives."""
    receive = request.receive
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise PayloadTooLargeError(f"Request body is over the limit of {limit} bytes")
        parts.append(part)
        if not message.get("more_body", False):
            break
    raw = parts[0] if len(parts) == 1 else b"".join(parts)
    request._body = raw  # what Request.body() would have kept, for anything reading it later
    return raw


def render(reply: Reply) -> Response:
    if reply.stream is not None:
        headers = {**reply.headers, "cache-control": "no-cache", "x-accel-buffering": "no"}
        return SSEResponse(reply.stream, headers, reply.on_close)
    return Response(reply.body, status_code=reply.status, headers=reply.headers, media_type=JSON)


Admitted = tuple[Services, Exchange, dict[str, Any], dict[str, str]]


async def admitted(request: Request, wire: type[BaseModel]) -> Admitted:
    """Authenticate, read the body within the size limit, validate it against ``wire``:
    (the services, the exchange, the body, the request headers the API reads)."""
    state = state_of(request)
    svc = state.services  # one consistent set of parts for the whole request
    headers = wanted_headers(request.scope)
    ex = state.open(request, headers, svc)
    server = svc.policy.server
    data: Any = None
    try:
        try:  # slow bodies cannot hold the slot
            body = _json_body(request, server.max_body_bytes, headers.get("content-length"))
            data = await state.body_deadlines.read(body, server.body_timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request body did not arrive within {server.body_timeout_s:g} seconds"
            ) from None
        validate(wire, data)
    except SwitchyardError as exc:  # refused at the door: its ledger row, metrics and log line
        ex.endpoint = endpoint_of(request.url.path)
        model = data.get("model") if isinstance(data, dict) else None
        ex.requested = model if isinstance(model, str) else ""
        await pipeline.failed(svc, ex, exc)
        raise
    return svc, ex, data, headers


@router.post(
    "/v1/chat/completions",
    responses=ERROR_RESPONSES,
    openapi_extra=openapi_extra(ChatCompletionRequest, streams=True),
)
async def chat_completions(request: Request) -> Response:
    svc, ex, data, headers = await admitted(request, ChatCompletionRequest)
    return render(await pipeline.serve(svc, Chat(svc, data, headers), ex))


@router.post(
    "/v1/completions",
    responses=ERROR_RESPONSES,
    openapi_extra=openapi_extra(CompletionRequest, streams=True),
)
async def completions(request: Request) -> Response:
    svc, ex, data, headers = await admitted(request, CompletionRequest)
    return render(await legacy.create(svc, data, headers, ex))


@router.post("/v1/embeddings", responses=ERROR_RESPONSES, openapi_extra=openapi_extra(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    svc, ex, data, _ = await admitted(request, EmbeddingRequest)
    return render(await pipeline.passthrough(svc, "embeddings", data, ex))


@router.get("/v1/models", responses=ERROR_RESPONSES)
async def list_models(request: Request) -> Response:
    state = state_of(request)
    svc = state.services
    ex = state.open(request, wanted_headers(request.scope), svc)
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": owner}
        for name, owner in svc.router.visible_models(ex.principal)
    ]
    _seen(svc, ex)
    return Response(orjson.dumps({"object": "list", "data": data}), media_type=JSON)


def _seen(svc: Services, ex: Exchange, error: SwitchyardError | None = None) -> None:
    """A models call's metric sample(s) and access-log line (no ledger row: nothing is bought)."""
    ex.endpoint = "models"
    if error is not None:
        ex.status, ex.http_status, ex.error_code = "error", error.status, error.code or error.type
        svc.metrics.rejections.labels(ex.error_code).inc()
    svc.metrics.requests.labels("models", "", "none", "none", ex.status, "off").inc()
    seconds = time.perf_counter() - ex.started
    access_log.note(ex, None, seconds, enabled=svc.policy.server.access_log)


@router.get("/v1/models/{model_id:path}", responses=ERROR_RESPONSES)
async def retrieve_model(request: Request, model_id: str) -> Response:
    """One model or route the caller may use (an alias the policy maps to a chat route too);
    404 in OpenAI's shape for anything else, whether it exists or the key may not see it."""
    state = state_of(request)
    svc = state.services
    ex = state.open(request, wanted_headers(request.scope), svc)
    ex.requested = model_id
    owner = dict(svc.router.visible_models(ex.principal)).get(model_id)
    if owner is None:  # an alias: whatever kind its route serves, keys configured or not
        try:
            svc.router.plan(model_id, ex.principal, svc.router.kind_of(model_id) or "chat")
            owner = "switchyard"
        except NotConfiguredError:
            owner = "switchyard"
        except SwitchyardError:
            error = NotFoundError(
                f"The model '{model_id}' does not exist or you do not have access to it.", param="model"
            )
            _seen(svc, ex, error)
            raise error from None
    _seen(svc, ex)
    body = {"id": model_id, "object": "model", "created": int(time.time()), "owned_by": owner}
    return Response(orjson.dumps(body), media_type=JSON)


@router.get("/healthz")
async def healthz() -> Response:
    return Response(b'{"status":"ok"}', media_type=JSON)


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    svc = state_of(request).services
    checks = {"policy": True, "ledger": svc.ledger.healthy(), "models": svc.semantic.ready}
    if svc.cache.backend == "redis":
        checks["redis"] = await svc.cache.ping()
    ok = all(checks.values())
    body = {"status": "ready" if ok else "not_ready", "checks": checks}
    return Response(orjson.dumps(body), status_code=200 if ok else 503, media_type=JSON)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    svc = state_of(request).services
    m = svc.metrics
    m.ledger_pending.set(svc.ledger.pending())
    m.ledger_outbox.set(svc.ledger.outbox_rows())
    held = svc.cache.held_bytes()
    if held is not None:
        m.exact_cache_bytes.set(held)
    for model, breaker_state in svc.breakers.states().items():
        m.breaker_open.labels(model).set(1 if breaker_state == "open" else 0)
    await admin.export_budget_gauges(svc)
    return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.post("/admin/policy/reload")
async def reload_policy(request: Request) -> Response:
    state = state_of(request)
    require_admin(request.headers, state.gateway.settings.admin_key)
    error = await state.gateway.reload()
    if error is not None:
        return error_response(error)
    return Response(orjson.dumps({"status": "reloaded"}), media_type=JSON)


HOT_ROUTES = {
    ("POST", "/v1/chat/completions"): chat_completions,
    ("POST", "/v1/completions"): completions,
    ("POST", "/v1/embeddings"): embeddings,
}
