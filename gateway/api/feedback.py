"""``POST /v1/feedback``: a score (0 bad .. 1 good) for a request the caller's key made, by its
x-request-id. Thin: authenticate, read the body, hand it to gateway/flow/learning.py (the
write happens on the feedback store's worker thread, never on the event loop)."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.responses import Response

from gateway.api.openapi import ERROR_RESPONSES, openapi_extra
from gateway.api.routes import _json_body, state_of
from gateway.api.state import wanted_headers
from gateway.flow import learning

router = APIRouter()


class FeedbackRequest(BaseModel):
    """The body of ``POST /v1/feedback`` (its OpenAPI schema; learning.post validates it)."""

    model_config = ConfigDict(extra="forbid")
    request_id: StrictStr
    score: Annotated[float, Field(ge=0, le=1)]


@router.post("/v1/feedback", responses=ERROR_RESPONSES, openapi_extra=openapi_extra(FeedbackRequest))
async def feedback(request: Request) -> Response:
    state = state_of(request)
    svc = state.services
    headers = wanted_headers(request.scope)
    ex = state.open(request, headers, svc)
    data = await _json_body(request, svc.policy.server.max_body_bytes, headers.get("content-length"))
    body = await learning.post(svc, ex.principal.tenant, data)
    return Response(orjson.dumps(body), media_type="application/json")
