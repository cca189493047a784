"""OpenAI Responses in: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``. Thin handlers: admit like the chat route, call
the pipeline with the Responses adapter (gateway/flow/adapters/responses.py) or
gateway/flow/stored_responses.py, render; errors leave in OpenAI's shape (the app's handlers)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.openapi import ERROR_RESPONSES, openapi_extra
from gateway.api.routes import admitted, render, state_of
from gateway.api.state import wanted_headers
from gateway.core.errors import BadRequestError
from gateway.flow import pipeline
from gateway.flow import stored_responses as flow
from gateway.flow.adapters.responses import Responses
from gateway.flow.services import Services
from gateway.protocols.openai_responses_wire import ResponsesRequest

router = APIRouter()
JSON = "application/json"


def _caller(request: Request) -> tuple[Services, str]:
    state = state_of(request)
    svc = state.services
    ex = state.open(request, wanted_headers(request.scope), svc)
    return svc, ex.principal.tenant


def _json(obj: dict[str, Any]) -> Response:
    return Response(orjson.dumps(obj), media_type=JSON)


@router.post(
    "/v1/responses", responses=ERROR_RESPONSES, openapi_extra=openapi_extra(ResponsesRequest, streams=True)
)
async def create_response(request: Request) -> Response:
    svc, ex, data, headers = await admitted(request, ResponsesRequest)
    return render(await pipeline.serve(svc, Responses(svc, data, headers), ex))


@router.get("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def get_response(request: Request, response_id: str) -> Response:
    svc, tenant = _caller(request)
    return _json(await flow.retrieve(svc, tenant, response_id))


@router.delete("/v1/responses/{response_id}", responses=ERROR_RESPONSES)
async def delete_response(request: Request, response_id: str) -> Response:
    svc, tenant = _caller(request)
    return _json(await flow.delete(svc, tenant, response_id))


@router.get("/v1/responses/{response_id}/input_items", responses=ERROR_RESPONSES)
async def list_input_items(
    request: Request, response_id: str, limit: int = 20, order: str = "desc", after: str | None = None
) -> Response:
    if not 1 <= limit <= 100:
        raise BadRequestError("'limit' must be between 1 and 100", param="limit")
    if order not in ("asc", "desc"):
        raise BadRequestError("'order' must be 'asc' or 'desc'", param="order")
    svc, tenant = _caller(request)
    return _json(await flow.list_input_items(svc, tenant, response_id, limit=limit, order=order, after=after))


HOT_ROUTES = {("POST", "/v1/responses"): create_response}
