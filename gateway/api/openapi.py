"""The OpenAPI document of the hot routes: request bodies from the wire models, one error shape.

The handlers read the raw JSON (fast, and unknown fields pass through); these schemas only
document the bodies and the error shape in /openapi.json (used by schemathesis in tests)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ERROR_STATUSES = {
    400: "Bad JSON or a bad field (the message names it)",
    401: "Missing or unknown key",
    403: "Model or route not allowed for this key",
    404: "Unknown model or route",
    413: "Request body over the limit",
    429: "Rate limited (Retry-After)",
    499: "Client closed the request",
    500: "Internal gateway error",
    502: "Upstream failure",
    503: "Upstream unavailable or the gateway at capacity (Retry-After)",
    504: "Upstream timeout",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for status, text in _ERROR_STATUSES.items()
}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Replace every local ``$ref`` by its definition (the wire models are not recursive)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    inlined: dict[str, Any] = _inline(schema, schema.get("$defs", {}))
    if "model" in inlined.get("properties", {}):
        inlined["properties"]["model"]["minLength"] = 1  # the router refuses an empty name
    return inlined


def openapi_extra(model: type[BaseModel], *, streams: bool = False) -> dict[str, Any]:
    """``openapi_extra`` for a route: its JSON request body and its 200 media types."""
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        # one SSE event: `data:` carries a chunk (JSON), an error object (JSON) or [DONE]
        event = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
        ok["text/event-stream"] = {"schema": event}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body_schema(model)}}},
        "responses": {"200": {"description": "The upstream's answer", "content": ok}},
    }
