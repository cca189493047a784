"""The OpenAI Responses request as the gateway accepts it: pydantic wire models (validation and
the /openapi.json schema) for the part of the API a chat upstream can serve: message items
(text and image parts), function calls and their outputs, reasoning items of earlier turns,
function and namespace tools, ``tool_choice``, ``text.format`` and ``reasoning``. Unknown
fields are allowed (``extra="allow"``) and ignored.

What cannot be served at all (built-in tools, other item types, ``background``,
``conversation``, ``prompt`` templates) is refused first, with a message that says so."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from gateway.core.errors import BadRequestError

Number = Annotated[float, Field(strict=False)]
UNSUPPORTED = ("background", "conversation", "prompt")
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "additional_tools",
    "configuration_update",
)
TOOL_TYPES = ("function", "namespace", "custom")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputText(_Open):
    type: Literal["input_text"]
    text: StrictStr


class OutputText(_Open):
    type: Literal["output_text"]
    text: StrictStr


class Refusal(_Open):
    type: Literal["refusal"]
    refusal: StrictStr


class InputImage(_Open):
    type: Literal["input_image"]
    image_url: StrictStr  # images by file_id need the provider's file store
    detail: Literal["low", "high", "auto"] | None = None


class InputMessage(_Open):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer"]
    content: StrictStr | list[InputText | InputImage | OutputText | Refusal]


class AssistantMessage(_Open):
    type: Literal["message"] | None = None
    role: Literal["assistant"]
    content: StrictStr | list[OutputText | Refusal | InputText]


class FunctionCall(_Open):
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr


class FunctionCallOutput(_Open):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | list[InputText | OutputText]


class Reasoning(_Open):
    type: Literal["reasoning"]


class FunctionTool(_Open):
    type: Literal["function"]
    name: Annotated[str, Field(strict=True, min_length=1, max_length=64)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class CustomTool(_Open):
    """A free-form tool (its input a string, optionally constrained by a grammar ``format``)."""

    type: Literal["custom"]
    name: Annotated[str, Field(strict=True, min_length=1, max_length=64)]
    description: StrictStr | None = None
    format: dict[str, Any] | None = None


class NamespaceTool(_Open):
    type: Literal["namespace"]
    name: StrictStr
    tools: list[FunctionTool | CustomTool]


class AdditionalTools(_Open):
    """Tools sent as an input item (Codex does so for its default models)."""

    type: Literal["additional_tools"]
    tools: list[FunctionTool | CustomTool | NamespaceTool]


class ConfigurationUpdate(_Open):
    type: Literal["configuration_update"]


class FunctionChoice(_Open):
    type: Literal["function"]
    name: StrictStr


class FormatText(_Open):
    type: Literal["text"]


class FormatJsonObject(_Open):
    type: Literal["json_object"]


class FormatJsonSchema(_Open):
    type: Literal["json_schema"]
    name: StrictStr
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class TextConfig(_Open):
    format: FormatText | FormatJsonObject | FormatJsonSchema | None = None


class ReasoningConfig(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


InputItem = (
    InputMessage
    | AssistantMessage
    | FunctionCall
    | FunctionCallOutput
    | Reasoning
    | AdditionalTools
    | ConfigurationUpdate
)
# at least one item a chat upstream gets (reasoning items are not sent)
_NOT_ONLY_REASONING: dict[str, Any] = {
    "contains": {
        "not": {"type": "object", "required": ["type"], "properties": {"type": {"const": "reasoning"}}}
    }
}


class ResponsesRequest(_Open):
    model: StrictStr
    input: StrictStr | Annotated[list[InputItem], Field(min_length=1, json_schema_extra=_NOT_ONLY_REASONING)]
    instructions: StrictStr | None = None
    tools: list[FunctionTool | CustomTool | NamespaceTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    stream: StrictBool | None = False
    store: StrictBool | None = True
    previous_response_id: StrictStr | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, StrictStr] | None = None
    include: list[StrictStr] | None = None
    prompt_cache_key: StrictStr | None = None
    user: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _servable(cls, data: Any) -> Any:
        refuse_unservable(data)
        return data


def refuse_unservable(data: Any) -> None:
    """What no chat upstream can serve: a 400 that says so and names the field."""
    if not isinstance(data, dict):
        return
    for name in UNSUPPORTED:
        if data.get(name) is not None:
            raise BadRequestError(f"'{name}' is not supported by this gateway", param=name)
    tools = data.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind not in TOOL_TYPES:
            raise BadRequestError(
                f"Built-in tools such as '{kind}' are not supported", param=f"tools[{i}].type"
            )
    items = data.get("input")
    only = (
        isinstance(items, list)
        and items
        and all(isinstance(i, dict) and i.get("type") == "reasoning" for i in items)
    )
    if only and not data.get("instructions"):
        raise BadRequestError("'input' has only reasoning items: nothing a model could answer", param="input")
    for i, item in enumerate(items if isinstance(items, list) else []):
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(kind, str) and kind not in ITEM_TYPES:
            param = f"input[{i}].type"
            raise BadRequestError(
                f"Input items of type '{kind}' cannot be served by this gateway", param=param
            )
        content = item.get("content") if isinstance(item, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and part.get("type") in ("input_file", "input_audio"):
                param = f"input[{i}].content[{j}].type"
                raise BadRequestError(
                    f"Content parts of type '{part['type']}' cannot be translated", param=param
                )
            if isinstance(part, dict) and part.get("type") == "input_image" and "image_url" not in part:
                param = f"input[{i}].content[{j}].image_url"
                raise BadRequestError("This gateway cannot translate images by file_id", param=param)
