"""The Batch APIs' wire formats, both providers: OpenAI's input lines (JSONL, one request a
line), batch object, output and error lines; Anthropic's Message Batches request list, batch
object and result lines. Pure translation: nothing here runs or stores anything.

An item's stored result is neutral: ``{"status_code", "request_id", "body"}`` once it ran
(``body``: the answer, or the error in the endpoint's protocol), ``{"error": {"code",
"message"}}`` for a line refused before it ran. Each API renders it its own way."""

from __future__ import annotations

from typing import Any, Final

import orjson
from pydantic import BaseModel

from gateway.core.batch import ENDPOINTS, Batch, ItemResult, NewItem
from gateway.core.errors import BadRequestError, SwitchyardError
from gateway.protocols.anthropic_messages import MessagesRequest
from gateway.protocols.openai_chat import ChatCompletionRequest, EmbeddingRequest, validate
from gateway.protocols.openai_responses_wire import ResponsesRequest

OPENAI_ENDPOINTS: Final = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
WIRE: Final[dict[str, type[BaseModel]]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
}
WINDOWS: Final = {"24h": 24 * 3600.0}  # what OpenAI accepts as completion_window
MAX_CUSTOM_ID: Final = 512


class LineError(BadRequestError):
    """One input line that cannot run: its error object in the batch's error file."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message, param=param, code=code)


def window_seconds(window: str) -> float:
    if window not in WINDOWS:
        raise BadRequestError(
            f"Invalid completion_window '{window}': supported values are {sorted(WINDOWS)}",
            param="completion_window",
        )
    return WINDOWS[window]


def check_body(endpoint: str, body: Any) -> dict[str, Any]:
    """One item's request body, valid for ``endpoint`` (LineError otherwise)."""
    if not isinstance(body, dict):
        raise LineError("invalid_request", "The request body must be a JSON object", "body")
    try:
        validate(WIRE[endpoint], body)
    except SwitchyardError as exc:
        raise LineError("invalid_request", exc.message, exc.param) from None
    if body.get("stream"):
        raise LineError(
            "invalid_request", "Batch requests cannot be streamed: remove 'stream'", "body.stream"
        )
    return body


def _openai_line(raw: bytes, endpoint: str) -> tuple[str, dict[str, Any]]:
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise LineError("invalid_json_line", "This line is not parseable as valid JSON.") from None
    if not isinstance(line, dict):
        raise LineError("invalid_request", "Each line must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise LineError("missing_required_parameter", "Each line needs a 'custom_id' string", "custom_id")
    if line.get("method", "POST") != "POST":
        raise LineError("invalid_method", "Only the POST method is supported", "method")
    if line.get("url") != endpoint:
        raise LineError(
            "mismatched_endpoint", f"The line's url must be the batch's endpoint '{endpoint}'", "url"
        )
    return custom_id, check_body(endpoint, line.get("body"))


def openai_items(
    data: bytes, endpoint: str, max_items: int
) -> tuple[list[NewItem], list[dict[str, Any]], str | None]:
    """The input file's lines -> items (a bad line is an errored item), the errors as OpenAI
    lists them (``{"code", "message", "param", "line"}``, lines from 1), and the first
    valid item's model."""
    items: list[NewItem] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    lines = [raw for raw in data.splitlines() if raw.strip()]
    if not lines:
        raise BadRequestError("The input file has no requests", param="input_file_id")
    if len(lines) > max_items:
        raise BadRequestError(
            f"The input file has {len(lines)} requests; a batch holds at most {max_items}",
            param="input_file_id",
        )
    for idx, raw in enumerate(lines):
        custom_id: str | None = None
        try:
            custom_id, body = _openai_line(raw, endpoint)
            if custom_id in seen:
                raise LineError(
                    "duplicate_custom_id", f"The custom_id '{custom_id}' is used more than once", "custom_id"
                )
            seen.add(custom_id)
            model = model or str(body.get("model"))
            items.append(NewItem(idx, custom_id, orjson.dumps(body)))
        except LineError as exc:
            errors.append({"code": exc.code, "message": exc.message, "param": exc.param, "line": idx + 1})
            refused = {"error": {"code": exc.code, "message": exc.message}}
            items.append(NewItem(idx, custom_id, None, "errored", orjson.dumps(refused)))
    return items, errors, model


def anthropic_items(requests: Any, max_items: int) -> tuple[list[NewItem], str | None]:
    """Message Batches' ``requests`` -> items; a request whose ``params`` are invalid is an
    errored item (its result says why), as Anthropic does."""
    if not isinstance(requests, list) or not requests:
        raise BadRequestError(
            "requests: a non-empty list of {custom_id, params} is required", param="requests"
        )
    if len(requests) > max_items:
        raise BadRequestError(f"requests: at most {max_items} requests a batch", param="requests")
    items: list[NewItem] = []
    seen: set[str] = set()
    model: str | None = None
    for idx, req in enumerate(requests):
        custom_id = req.get("custom_id") if isinstance(req, dict) else None
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 64:
            raise BadRequestError(
                f"requests.{idx}.custom_id: a string of 1 to 64 characters is required",
                param=f"requests.{idx}.custom_id",
            )
        if custom_id in seen:
            raise BadRequestError(
                f"requests.{idx}.custom_id: '{custom_id}' is used more than once",
                param=f"requests.{idx}.custom_id",
            )
        seen.add(custom_id)
        try:
            body = check_body("/v1/messages", req.get("params"))
            model = model or str(body.get("model"))
            items.append(NewItem(idx, custom_id, orjson.dumps(body)))
        except LineError as exc:
            refused = {"error": {"code": "invalid_request_error", "message": f"params: {exc.message}"}}
            items.append(NewItem(idx, custom_id, None, "errored", orjson.dumps(refused)))
    return items, model


# --------------------------------------------------------------------------- objects
def openai_counts(counts: dict[str, int]) -> dict[str, int]:
    total = sum(counts.values())
    return {
        "total": total,
        "completed": counts.get("succeeded", 0),
        "failed": counts.get("errored", 0) + counts.get("expired", 0) + counts.get("canceled", 0),
    }


def openai_batch(b: Batch, counts: dict[str, int]) -> dict[str, Any]:
    t = {k: int(v) for k, v in b.times.items()}
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "model": b.model,
        "errors": None if not b.errors else {"object": "list", "data": b.errors},
        "input_file_id": b.input_file_id or "",
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": int(b.created_at),
        "in_progress_at": t.get("in_progress_at"),
        "expires_at": int(b.expires_at),
        "finalizing_at": t.get("finalizing_at"),
        "completed_at": t.get("completed_at"),
        "failed_at": t.get("failed_at"),
        "expired_at": t.get("expired_at"),
        "cancelling_at": t.get("cancelling_at"),
        "cancelled_at": t.get("cancelled_at"),
        "request_counts": openai_counts(counts),
        "metadata": b.metadata,
    }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


ANTHROPIC_STATUS: Final = {
    "in_progress": "in_progress",
    "validating": "in_progress",
    "finalizing": "in_progress",
    "cancelling": "canceling",
}


def anthropic_batch(b: Batch, counts: dict[str, int], results_url: str) -> dict[str, Any]:
    status = ANTHROPIC_STATUS.get(b.status, "ended")
    ended = b.times.get("completed_at") or b.times.get("cancelled_at") or b.times.get("expired_at")
    return {
        "id": b.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": counts.get("pending", 0) + counts.get("running", 0),
            "succeeded": counts.get("succeeded", 0),
            "errored": counts.get("errored", 0),
            "canceled": counts.get("canceled", 0),
            "expired": counts.get("expired", 0),
        },
        "ended_at": _iso(ended) if status == "ended" else None,
        "created_at": _iso(b.created_at),
        "expires_at": _iso(b.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _iso(b.times.get("cancelling_at")),
        "results_url": results_url if status == "ended" else None,
    }


# --------------------------------------------------------------------------- results
def ran(status_code: int, request_id: str, body: Any) -> bytes:
    return orjson.dumps({"status_code": status_code, "request_id": request_id, "body": body})


def closed(status: str) -> bytes:
    """The result of an item that never ran (``canceled``, ``expired``)."""
    message = (
        "This request was not run: the batch was cancelled"
        if status == "canceled"
        else ("This request could not be executed before the completion window expired.")
    )
    return orjson.dumps(
        {
            "error": {
                "code": "batch_cancelled" if status == "canceled" else "batch_expired",
                "message": message,
            }
        }
    )


def openai_line(batch_id: str, item: ItemResult) -> tuple[bool, bytes]:
    """(goes to the output file?, the JSONL line): succeeded items go to the output file, the
    rest (an error answer, a refused line, a cancelled or expired request) to the error file."""
    stored = orjson.loads(item.result) if item.result else {}
    line: dict[str, Any] = {
        "id": f"batch_req_{batch_id.removeprefix('batch_')}_{item.idx}",
        "custom_id": item.custom_id,
        "response": None,
        "error": None,
    }
    if "status_code" in stored:
        line["response"] = {k: stored[k] for k in ("status_code", "request_id", "body")}
    else:
        line["error"] = stored.get("error")
    return item.status == "succeeded", orjson.dumps(line) + b"\n"


def anthropic_line(item: ItemResult) -> bytes:
    stored = orjson.loads(item.result) if item.result else {}
    result: dict[str, Any]
    if item.status == "succeeded":
        result = {"type": "succeeded", "message": stored["body"]}
    elif item.status in ("canceled", "expired"):
        result = {"type": item.status}
    elif "status_code" in stored:
        result = {"type": "errored", "error": stored["body"]}
    else:
        err = stored.get("error") or {}
        result = {
            "type": "errored",
            "error": {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": err.get("message", "invalid request")},
            },
        }
    return orjson.dumps({"custom_id": item.custom_id, "result": result}) + b"\n"


def endpoint_kind(path: str) -> str:
    return ENDPOINTS[path]
