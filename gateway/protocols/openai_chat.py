"""OpenAI chat and embeddings in: wire models for request validation (and the OpenAPI
document); the chat adapter (gateway/flow/adapters/chat.py) makes the request record.

The models check the fields Switchyard or an upstream would trip over and allow every other field
(``extra="allow"``): unknown fields pass through to OpenAI-compatible upstreams. The handler
keeps the client's own JSON object; these models only validate it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from gateway.core.errors import BadRequestError

# A JSON number, as OpenAI types it: an integer or a float, never a bool or a numeric string
# (``temperature: true`` or ``top_p: "1"`` is refused, naming the field, not forwarded).
Number = StrictFloat
MAX_JSON_DEPTH = 64  # nesting of arrays/objects in a request body; deeper is refused with a 400


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


def check_depth(raw: bytes, data: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse a JSON body that nests arrays/objects deeper than ``limit`` (a 400 naming the
    problem): deep documents parse, then break whatever writes or walks them later."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # too few brackets to nest that deep (the common case: nothing to walk)
    if not isinstance(data, (dict, list)):
        return
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise too_deep(limit)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def too_deep(limit: int = MAX_JSON_DEPTH) -> BadRequestError:
    return BadRequestError(
        f"The JSON body nests arrays/objects deeper than {limit} levels; send a flatter document"
    )


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
