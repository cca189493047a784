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
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from gateway.core.errors import BadRequestError, SwitchyardError
from gateway.core.types import Usage

Number = Annotated[float, Field(strict=False)]
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_DROPPED_FIELDS = ("thinking", "metadata", "service_tier", "container", "mcp_servers")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


# ----------------------------------------------------------------------------- wire models
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Block(_Open):
    type: StrictStr


class Message(_Open):
    role: Literal["user", "assistant"]
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
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def cache_breakpoints(body: dict[str, Any]) -> int:
    """How many ``cache_control`` markers the request carries (the provider allows 4)."""
    count = 0
    blocks: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            blocks += body[key]
    for msg in body.get("messages") or ():
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            blocks += msg["content"]
    for block in blocks:
        if isinstance(block, dict) and block.get("cache_control") is not None:
            count += 1
    return count


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
        messages.append({"role": "system", "content": _text_of(system, "system", dropped)})
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
        out["tools"] = [_chat_tool(t, f"tools[{i}]", dropped) for i, t in enumerate(body["tools"])]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = _chat_tool_choice(choice)
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
            tools.append(_chat_tool(tool, f"tools[{i}]", []))
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


def _note_cache(block: dict[str, Any], dropped: list[str]) -> None:
    if block.get("cache_control") is not None:
        dropped.append("cache_control")


def _text_of(content: Any, where: str, dropped: list[str]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequestError(f"{where}[{j}]: only text blocks can be sent here", param=f"{where}[{j}]")
        _note_cache(block, dropped)
        parts.append(block["text"])
    return "\n\n".join(parts)


def _chat_messages(msg: dict[str, Any], where: str, dropped: list[str]) -> list[dict[str, Any]]:
    content = msg["content"]
    if isinstance(content, str):
        return [{"role": msg["role"], "content": content}]
    if msg["role"] == "assistant":
        return [_assistant(content, where, dropped)]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        _note_cache(block, dropped)
        kind = block.get("type")
        if kind == "tool_result":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _str(block, "tool_use_id", at),
                    "content": _result(block, at),
                }
            )
        elif kind == "text":
            parts.append({"type": "text", "text": _str(block, "text", at)})
        elif kind == "image":
            parts.append(_image(block, at))
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
        _note_cache(block, dropped)
        kind = block.get("type")
        if kind == "text":
            texts.append(_str(block, "text", at))
        elif kind == "tool_use":
            args = json.dumps(block.get("input") or {}, ensure_ascii=False)
            fn = {"name": _str(block, "name", at), "arguments": args}
            calls.append({"id": _str(block, "id", at), "type": "function", "function": fn})
        elif kind in ("thinking", "redacted_thinking"):
            dropped.append("thinking")
        else:
            raise BadRequestError(f"{at}: a '{kind}' block cannot be sent to this model's upstream", param=at)
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _str(block: dict[str, Any], key: str, at: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise BadRequestError(f"{at}.{key}: a string is required", param=f"{at}.{key}")
    return value


def _result(block: dict[str, Any], at: str) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        text = "\n\n".join(str(b.get("text", "")) for b in content)
    else:
        raise BadRequestError(f"{at}.content: only text tool results can be sent here", param=f"{at}.content")
    return f"Error: {text}" if block.get("is_error") else text


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type', 'image/png')};base64,{src['data']}"
    elif isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadRequestError(f"{at}.source: a base64 or url image source is required", param=f"{at}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _chat_tool(tool: dict[str, Any], at: str, dropped: list[str]) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise BadRequestError(f"{at}: server tool '{tool.get('type')}' needs an Anthropic upstream", param=at)
    _note_cache(tool, dropped)
    fn: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none"}.get(kind, "auto")


# ----------------------------------------------------------------------------- chat -> Messages
def usage_json(usage: Usage) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` excludes cache reads and writes (counted apart)."""
    read, write = usage.cached_input_tokens or 0, usage.cache_write_tokens or 0
    return {
        "input_tokens": max(0, (usage.input_tokens or 0) - read - write),
        "output_tokens": usage.output_tokens or 0,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
    }


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
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_sy",
                "name": fn.get("name") or "",
                "input": _arguments(fn.get("arguments")),
            }
        )
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
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
