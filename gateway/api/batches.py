"""The Files and Batch APIs over HTTP. Thin handlers: authenticate like every route, read
the body, call gateway/flow/batches.py, render. OpenAI's ``/v1/files`` and ``/v1/batches``
answer errors in OpenAI's shape (the app's handlers); Anthropic's ``/v1/messages/batches``
in Anthropic's (``api.messages._guarded``)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response, StreamingResponse

from gateway.api.messages import _guarded
from gateway.api.openapi import ERROR_RESPONSES
from gateway.api.routes import _json_body, state_of
from gateway.api.state import wanted_headers
from gateway.core.errors import BadRequestError, PayloadTooLargeError
from gateway.core.types import Principal
from gateway.flow import batches as flow
from gateway.flow.services import Services
from gateway.protocols.batches import OPENAI_ENDPOINTS

router = APIRouter()
JSON = "application/json"


def _documented(schema: dict[str, Any], media: str = JSON, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a request body (/openapi.json only; handlers read it raw)."""
    return {"requestBody": {"required": required, "content": {media: {"schema": schema}}}}


UPLOAD = _documented(
    {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"type": "string", "enum": ["batch"]},
        },
    },
    "multipart/form-data",
)
CREATE = _documented(
    {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": {"type": "string"},
            "endpoint": {"type": "string", "enum": list(OPENAI_ENDPOINTS)},
            "completion_window": {"type": "string", "enum": ["24h"]},
            "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        },
    }
)
MESSAGE_BATCH = _documented(
    {
        "type": "object",
        "required": ["requests"],
        "properties": {
            "requests": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["custom_id", "params"],
                    "properties": {"custom_id": {"type": "string"}, "params": {"type": "object"}},
                },
            }
        },
    }
)
NO_BODY = _documented({"type": "object"}, required=False)


def _caller(request: Request) -> tuple[Services, Principal]:
    state = state_of(request)
    svc = state.services
    ex = state.open(request, wanted_headers(request.scope), svc)
    return svc, ex.principal


def _json(obj: dict[str, Any]) -> Response:
    return Response(orjson.dumps(obj), media_type=JSON)


def _woken(request: Request, obj: dict[str, Any]) -> Response:
    """A batch was created or cancelled: the runner turns now, not at its next poll."""
    state_of(request).gateway.batch_runner.wake()
    return _json(obj)


def _limit(limit: int, most: int = 100) -> int:
    if not 1 <= limit <= most:
        raise BadRequestError(f"'limit' must be between 1 and {most}", param="limit")
    return limit


async def _body(request: Request, svc: Services) -> Any:
    return await _json_body(request, svc.policy.server.max_body_bytes, request.headers.get("content-length"))


# --------------------------------------------------------------------------- files
@router.post("/v1/files", responses=ERROR_RESPONSES, openapi_extra=UPLOAD)
async def upload_file(request: Request) -> Response:
    svc, who = _caller(request)
    most = svc.policy.batches.max_file_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > most + 64 * 1024:
        raise PayloadTooLargeError(f"The file is over the limit of {most} bytes")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as exc:  # a malformed multipart body
        raise BadRequestError(
            f"Send the file as multipart/form-data with 'file' and 'purpose': {exc}"
        ) from None
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise BadRequestError("Missing required parameter: 'file'", param="file")
        if not isinstance(purpose, str):
            raise BadRequestError("Missing required parameter: 'purpose'", param="purpose")
        data = await upload.read(most + 1)
        if len(data) > most:
            raise PayloadTooLargeError(f"The file is over the limit of {most} bytes")
        return _json(await flow.upload(svc, who.tenant, purpose, upload.filename or "upload.jsonl", data))
    finally:
        await form.close()


@router.get("/v1/files", responses=ERROR_RESPONSES)
async def list_files(
    request: Request,
    purpose: str | None = None,
    after: str | None = None,
    limit: int = 10000,
    order: str = "desc",
) -> Response:
    svc, who = _caller(request)
    if order not in ("asc", "desc"):
        raise BadRequestError("'order' must be 'asc' or 'desc'", param="order")
    return _json(await flow.list_files(svc, who.tenant, purpose, after, _limit(limit, 10000), order))


@router.get("/v1/files/{file_id}", responses=ERROR_RESPONSES)
async def retrieve_file(request: Request, file_id: str) -> Response:
    svc, who = _caller(request)
    return _json(await flow.file_of(svc, who.tenant, file_id))


@router.get("/v1/files/{file_id}/content", responses=ERROR_RESPONSES)
async def file_content(request: Request, file_id: str) -> Response:
    svc, who = _caller(request)
    return Response(await flow.file_content(svc, who.tenant, file_id), media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", responses=ERROR_RESPONSES)
async def delete_file(request: Request, file_id: str) -> Response:
    svc, who = _caller(request)
    return _json(await flow.delete_file(svc, who.tenant, file_id))


# --------------------------------------------------------------------------- OpenAI batches
@router.post("/v1/batches", responses=ERROR_RESPONSES, openapi_extra=CREATE)
async def create_batch(request: Request) -> Response:
    svc, who = _caller(request)
    return _woken(request, await flow.create_openai(svc, who, await _body(request, svc)))


@router.get("/v1/batches", responses=ERROR_RESPONSES)
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> Response:
    svc, who = _caller(request)
    return _json(await flow.list_batches(svc, who.tenant, "openai", after, _limit(limit)))


@router.get("/v1/batches/{batch_id}", responses=ERROR_RESPONSES)
async def retrieve_batch(request: Request, batch_id: str) -> Response:
    svc, who = _caller(request)
    return _json(await flow.retrieve(svc, who.tenant, "openai", batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=ERROR_RESPONSES, openapi_extra=NO_BODY)
async def cancel_batch(request: Request, batch_id: str) -> Response:
    svc, who = _caller(request)
    return _woken(request, await flow.cancel(svc, who.tenant, "openai", batch_id))


# --------------------------------------------------------------------------- Anthropic
async def _create_message_batch(request: Request) -> Response:
    svc, who = _caller(request)
    return _woken(request, await flow.create_anthropic(svc, who, await _body(request, svc)))


def _anthropic_list(request: Request) -> tuple[str | None, int]:
    q = request.query_params
    raw = q.get("limit", "20")
    if not raw.isdigit():
        raise BadRequestError("'limit' must be an integer", param="limit")
    return q.get("after_id"), _limit(int(raw), 1000)


async def _list_message_batches(request: Request) -> Response:
    svc, who = _caller(request)
    after, limit = _anthropic_list(request)
    page = await flow.list_batches(svc, who.tenant, "anthropic", after, limit)
    return _json({k: page[k] for k in ("data", "has_more", "first_id", "last_id")})


def _batch_id(request: Request) -> str:
    return str(request.path_params["batch_id"])


async def _retrieve_message_batch(request: Request) -> Response:
    svc, who = _caller(request)
    return _json(await flow.retrieve(svc, who.tenant, "anthropic", _batch_id(request)))


async def _cancel_message_batch(request: Request) -> Response:
    svc, who = _caller(request)
    return _woken(request, await flow.cancel(svc, who.tenant, "anthropic", _batch_id(request)))


async def _message_batch_results(request: Request) -> Response:
    svc, who = _caller(request)
    lines = await flow.anthropic_results(svc, who.tenant, _batch_id(request))
    return StreamingResponse(lines, media_type="application/binary")


@router.post("/v1/messages/batches", openapi_extra=MESSAGE_BATCH)
async def create_message_batch(request: Request) -> Response:
    return await _guarded(request, _create_message_batch)


@router.get("/v1/messages/batches")
async def list_message_batches(request: Request) -> Response:
    return await _guarded(request, _list_message_batches)


@router.get("/v1/messages/batches/{batch_id}")
async def retrieve_message_batch(request: Request, batch_id: str) -> Response:
    return await _guarded(request, _retrieve_message_batch)


@router.post("/v1/messages/batches/{batch_id}/cancel", openapi_extra=NO_BODY)
async def cancel_message_batch(request: Request, batch_id: str) -> Response:
    return await _guarded(request, _cancel_message_batch)


@router.get("/v1/messages/batches/{batch_id}/results")
async def message_batch_results(request: Request, batch_id: str) -> Response:
    return await _guarded(request, _message_batch_results)
