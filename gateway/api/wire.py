"""OpenAI wire models for request validation (and the OpenAPI document).

They check the fields Switchyard or an upstream would trip over and allow every other field
(``extra="allow"``): unknown fields pass through to OpenAI-compatible upstreams. The handler
keeps the client's own JSON object; these models only validate it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from gateway.core.errors import BadRequestError

Number = Annotated[float, Field(strict=False)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: StrictStr


class ToolCallFunction(_Open):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Open):
    id: StrictStr
    type: StrictStr = "function"
    function: ToolCallFunction


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None


class FunctionDef(_Open):
    name: Annotated[str, Field(strict=True, min_length=1, max_length=64)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: StrictStr
    function: FunctionDef | None = None


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]


class ChatCompletionRequest(_Open):
    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    seed: StrictInt | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    user: StrictStr | None = None
    tools: list[Tool] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    logit_bias: dict[str, Number] | None = None


class CompletionRequest(_Open):
    model: StrictStr
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    stream: Literal[False] | None = False
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None


class EmbeddingRequest(_Open):
    model: StrictStr
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None


def _param(loc: tuple[int | str, ...], data: Any) -> str:
    """The client's own path to the bad field (``messages[0].role``). Pydantic puts union
    branch labels (``str``, ``list[ContentPart]``) into locations; only the parts that index
    the client's JSON are kept."""
    out = ""
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str):
            out += f".{part}" if out else part
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out += f"[{part}]"
            node = node[part]
    return out


def validate(model: type[BaseModel], data: Any) -> None:
    """Validate ``data`` against ``model``; raise a 400 naming the first bad field."""
    if not isinstance(data, dict):
        raise BadRequestError("The request body must be a JSON object")
    try:
        model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        # Prefer the error at the deepest path (unions report one error per branch).
        err = max(errors, key=lambda e: len(e["loc"]))
        param = _param(tuple(err["loc"]), data)
        if err["type"] == "missing":
            raise BadRequestError(f"Missing required parameter: '{param}'", param=param) from None
        raise BadRequestError(f"Invalid value for '{param}': {err['msg']}", param=param) from None


# ----------------------------------------------------------------------------- OpenAPI
# The handlers read the raw JSON (fast, and unknown fields pass through); these schemas only
# document the bodies and the error shape in /openapi.json (used by schemathesis in tests).

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
