"""Anthropic Messages in (``POST /v1/messages``): wire validation, the Anthropic error shape,
and the translation to and from OpenAI chat for upstreams that only speak chat completions
(vLLM, OpenAI-compatible APIs). An Anthropic upstream gets the client's body as it is
(gateway/providers/anthropic.py, ``messages``); nothing here runs on that path but validation.

Translation decisions (Messages -> chat):
- ``system`` (text or text blocks) becomes the first system message; ``tool_use`` blocks
  become assistant ``tool_calls``; ``tool_result`` blocks become ``tool`` messages; images
  (base64 or url sources) become ``image_url`` parts; ``stop_sequences`` -> ``stop``;
  ``tool_choice`` any/tool/none/auto -> required/function/none/auto; ``top_k`` is passed on
  (vLLM honours it).
- What a chat upstream has no place for is not sent and is named in the reply header
  ``x-switchyard-dropped``: ``thinking`` (the config and earlier turns' thinking blocks),
  ``cache_control`` markers, ``metadata``, ``service_tier``. Anything else that cannot be
  translated (documents, server tools, unknown block types) is a 400 naming the field.

The facts this shares with the outbound direction (chat clients served by Anthropic:
anthropic_outbound.py) are written once in anthropic_format.py: stop reasons, error types,
usage, system, images, tools, tool choice, tool calls and tool results.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gateway.core.errors import BadRequestError, SwitchyardError
from gateway.core.types import Usage
from gateway.protocols import anthropic_format as fmt
from gateway.protocols.anthropic_format import STOP_REASONS as STOP_REASONS  # re-exported
from gateway.protocols.anthropic_format import usage_json as usage_json  # re-exported

Number = Annotated[float, Field(strict=False)]
_DROPPED_FIELDS = ("thinking", "metadata", "service_tier", "container", "mcp_servers")


# ----------------------------------------------------------------------------- wire models
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Block(_Open):
    type: StrictStr


class Message(_Open):
    # "system": a system message inside the conversation (Claude Code sends one after the
    # first user turn); a chat upstream gets it as a system message in the same place.
    role: Literal["user", "assistant", "system"]
    content: StrictStr | list[Block]


class Tool(_Open):
    name: StrictStr


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]


class CountTokensRequest(_Open):
    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    system: StrictStr | list[Block] | None = None
    tools: list[Tool] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[StrictInt, Field(ge=1)]
    stream: StrictBool | None = False
    temperature: Annotated[Number, Field(ge=0, le=1)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    stop_sequences: list[StrictStr] | None = None
    tool_choice: ToolChoice | None = None


# ----------------------------------------------------------------------------- errors
def error_body(exc: SwitchyardError) -> dict[str, Any]:
    """The Anthropic error shape for any error of the tree."""
    return {"type": "error", "error": {"type": fmt.error_type(exc.status), "message": exc.message}}


def cache_breakpoints(body: dict[str, Any]) -> int:
    """How many ``cache_control`` markers the request carries (the provider allows 4)."""
    return sum(
        1 for b in fmt.cache_blocks(body) if isinstance(b, dict) and b.get("cache_control") is not None
    )


# ----------------------------------------------------------------------------- Messages -> chat
def to_chat(body: dict[str, Any], *, strict: bool = True) -> tuple[dict[str, Any], list[str]]:
    """A validated Messages body as an OpenAI chat body, and the names of what was dropped.

    ``strict=False`` never refuses: a block a chat upstream cannot take (a document, a server
    tool, a thinking block, an unknown type) becomes a text part holding its JSON. That body is
    the request's facts (what budgets count, keys hash and the classifier reads: every block
    counts), never something sent to a chat upstream."""
    dropped = [f for f in _DROPPED_FIELDS if body.get(f) is not None]
    if not strict:
        return _lenient(body), dropped
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": fmt.system_to_chat(system, "system", dropped)})
    for i, msg in enumerate(body["messages"]):
        messages += _chat_messages(msg, f"messages[{i}]", dropped)
    out: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if body.get("stream"):
        out["stream"] = True
    if body.get("tools"):
        out["tools"] = [fmt.tool_to_chat(t, f"tools[{i}]", dropped) for i, t in enumerate(body["tools"])]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = fmt.tool_choice_to_chat(choice)
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out, sorted(set(dropped))


def _lenient(body: dict[str, Any]) -> dict[str, Any]:
    """The strict translation where it applies, each untranslatable piece as its JSON text."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _loose_text(system)})
    for i, msg in enumerate(body["messages"]):
        try:
            messages += _chat_messages(msg, f"messages[{i}]", [])
        except BadRequestError:
            messages.append({"role": msg["role"], "content": _loose_text(msg["content"])})
    out: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_tokens") is not None:
        out["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    tools = []
    for i, tool in enumerate(body.get("tools") or ()):
        try:
            tools.append(fmt.tool_to_chat(tool, f"tools[{i}]", []))
        except BadRequestError:  # a server tool: its JSON, as a function the counter reads
            fn = {"name": str(tool.get("name") or tool.get("type")), "description": json.dumps(tool)}
            tools.append({"type": "function", "function": fn})
    if tools:
        out["tools"] = tools
    return out


def _loose_text(content: Any) -> str:
    """Text blocks' text; any other block as its JSON (for counting and keys only)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else [content]:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        else:
            parts.append(json.dumps(block, ensure_ascii=False, sort_keys=True))
    return "\n\n".join(parts)


def _chat_messages(msg: dict[str, Any], where: str, dropped: list[str]) -> list[dict[str, Any]]:
    content = msg["content"]
    if msg["role"] == "system":
        return [{"role": "system", "content": fmt.system_to_chat(content, f"{where}.content", dropped)}]
    if isinstance(content, str):
        return [{"role": msg["role"], "content": content}]
    if msg["role"] == "assistant":
        return [_assistant(content, where, dropped)]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        fmt.note_cache(block, dropped)
        kind = block.get("type")
        if kind == "tool_result":
            out.append(fmt.tool_result_to_chat(block, at))
        elif kind == "text":
            parts.append({"type": "text", "text": fmt.required_str(block, "text", at)})
        elif kind == "image":
            parts.append(fmt.image_to_chat(block, at))
        else:
            raise BadRequestError(f"{at}: a '{kind}' block cannot be sent to this model's upstream", param=at)
    if parts:
        simple = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "\n\n".join(p["text"] for p in parts) if simple else parts})
    return out


def _assistant(content: list[dict[str, Any]], where: str, dropped: list[str]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        fmt.note_cache(block, dropped)
        kind = block.get("type")
        if kind == "text":
            texts.append(fmt.required_str(block, "text", at))
        elif kind == "tool_use":
            calls.append(fmt.tool_use_to_chat(block, at))
        elif kind in ("thinking", "redacted_thinking"):
            dropped.append("thinking")
        else:
            raise BadRequestError(f"{at}: a '{kind}' block cannot be sent to this model's upstream", param=at)
    return fmt.assistant_message(texts, calls)


# ----------------------------------------------------------------------------- chat -> Messages
def from_chat(completion: dict[str, Any], model: str, usage: Usage) -> dict[str, Any]:
    """An OpenAI chat completion as an Anthropic message (first choice)."""
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            fmt.tool_use(call.get("id") or "toolu_sy", fn.get("name") or "", _arguments(fn.get("arguments")))
        )
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": fmt.stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": usage_json(usage),
    }


def _arguments(raw: Any) -> Any:
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_sy{int(time.time() * 1000)}"
