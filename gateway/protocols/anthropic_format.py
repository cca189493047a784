"""The Anthropic Messages format's facts, each written once with both its directions.

Two translators read the format: the inbound adapter (``anthropic_messages``: a Messages
client served by a chat upstream, ``anthropic_events`` for its stream) and the outbound one
(``anthropic_outbound``: a chat client served by Anthropic, through providers/anthropic.py).
Whatever both need sits here as one table or as a pair of converters side by side, the one
``*_to_chat`` (Anthropic -> OpenAI chat), the other ``*_to_anthropic`` (chat -> Anthropic):
stop reasons, error types, usage, system, images, tools, tool choice, tool calls and tool
results. Pure functions, no I/O.

Requests are checked as they are translated: an Anthropic-side problem is a 400 naming the
field (``at``); a chat-side one says it is "not supported by Anthropic targets"."""

from __future__ import annotations

import json
from typing import Any

from gateway.core.errors import BadRequestError
from gateway.core.types import Usage
from gateway.core.types import usage_from_anthropic as usage_from_anthropic  # Anthropic -> Usage

# ----------------------------------------------------------------------------- stop reasons
# stop_reason <-> finish_reason: the pairs that map both ways; then the stop reasons read one
# way only (their finish reason maps back to the pair's stop reason).
_STOPS = (
    ("end_turn", "stop"),
    ("max_tokens", "length"),
    ("tool_use", "tool_calls"),
    ("refusal", "content_filter"),
)
FINISH_REASONS = dict(_STOPS) | {
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}
STOP_REASONS = {finish: stop for stop, finish in _STOPS}


def finish_reason(stop: Any) -> str:
    """An Anthropic ``stop_reason`` as an OpenAI ``finish_reason`` (unknown: "stop")."""
    return FINISH_REASONS.get(stop, "stop") if isinstance(stop, str) else "stop"


def stop_reason(finish: Any) -> str:
    """An OpenAI ``finish_reason`` as an Anthropic ``stop_reason`` (none or unknown: "end_turn")."""
    return STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn"


# ----------------------------------------------------------------------------- error types
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """The Anthropic error type of an HTTP status."""
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


# The types worth a retry: an ``error`` event in a stream names its type but no status.
RETRYABLE_ERROR_TYPES = frozenset(error_type(status) for status in (429, 500, 503, 504))


# ----------------------------------------------------------------------------- usage
def usage_json(usage: Usage) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` excludes cache reads and writes (counted apart).
    The way back is ``usage_from_anthropic`` (in core: the flow meters pass-through with it)."""
    read, write = usage.cached_input_tokens or 0, usage.cache_write_tokens or 0
    return {
        "input_tokens": max(0, (usage.input_tokens or 0) - read - write),
        "output_tokens": usage.output_tokens or 0,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
    }


# ----------------------------------------------------------------------------- small helpers
def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def unsupported(message: str, param: str) -> BadRequestError:
    """A chat request's field that an Anthropic upstream cannot take."""
    return BadRequestError(f"{message} (not supported by Anthropic targets)", param=param)


def required_str(block: dict[str, Any], key: str, at: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise BadRequestError(f"{at}.{key}: a string is required", param=f"{at}.{key}")
    return value


def note_cache(block: dict[str, Any], dropped: list[str]) -> None:
    """Note a ``cache_control`` marker that the chat side has no place for."""
    if block.get("cache_control") is not None:
        dropped.append("cache_control")


def _keep_cache(part: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """``block`` with the chat part's ``cache_control`` marker, when it has one."""
    if "cache_control" in part:
        block["cache_control"] = part["cache_control"]
    return block


def cache_blocks(body: dict[str, Any]) -> list[Any]:
    """The blocks of a Messages body that may carry ``cache_control``: system, tools and the
    messages' content blocks."""
    blocks: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            blocks += body[key]
    for msg in body.get("messages") or ():
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            blocks += msg["content"]
    return blocks


def chat_parts(content: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """A chat message's content parts, each with its place."""
    if not isinstance(content, list):
        raise BadRequestError("content must be a string or a list of parts", param=f"{where}.content")
    out: list[tuple[str, dict[str, Any]]] = []
    for j, part in enumerate(content):
        pwhere = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise BadRequestError("each content part must be an object", param=pwhere)
        out.append((pwhere, part))
    return out


def text_to_anthropic(part: dict[str, Any], where: str) -> dict[str, Any]:
    text = part.get("text")
    if not isinstance(text, str):
        raise BadRequestError("text content parts need a string 'text'", param=f"{where}.text")
    return _keep_cache(part, {"type": "text", "text": text})


def texts_to_anthropic(content: Any, where: str, what: str) -> list[dict[str, Any]]:
    """A chat content list that may hold text parts only (``what``: for the error) as text blocks."""
    blocks = []
    for pwhere, part in chat_parts(content, where):
        if part.get("type") != "text":
            raise unsupported(f"non-text {what}", f"{pwhere}.type")
        blocks.append(text_to_anthropic(part, pwhere))
    return blocks


# ----------------------------------------------------------------------------- system
def system_to_chat(content: Any, where: str, dropped: list[str]) -> str:
    """``system`` (text or text blocks) as the text of a chat system message."""
    if isinstance(content, str):
        return content
    parts = []
    for j, block in enumerate(content):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequestError(f"{where}[{j}]: only text blocks can be sent here", param=f"{where}[{j}]")
        note_cache(block, dropped)
        parts.append(block["text"])
    return "\n\n".join(parts)


def system_to_anthropic(content: Any, where: str) -> list[dict[str, Any]]:
    """A chat system/developer message's content as ``system`` text blocks (empty ones left out)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in texts_to_anthropic(content, where, "system content") if b["text"]]


# ----------------------------------------------------------------------------- images
def image_to_chat(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An image block (base64 or url source) as an ``image_url`` part."""
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type', 'image/png')};base64,{src['data']}"
    elif isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadRequestError(f"{at}.source: a base64 or url image source is required", param=f"{at}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def image_to_anthropic(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image_url`` part (a base64 data: URL or an http(s) URL) as an image block."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise BadRequestError("image_url needs a 'url'", param=f"{where}.image_url.url")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        if not sep or not header.endswith(";base64"):
            raise unsupported("image data URLs that are not base64", f"{where}.image_url.url")
        source: dict[str, Any] = {"type": "base64", "media_type": header[: -len(";base64")], "data": data}
    elif url.startswith(("http://", "https://")):
        source = {"type": "url", "url": url}
    else:
        raise unsupported("image URLs other than data:, http: or https:", f"{where}.image_url.url")
    return _keep_cache(part, {"type": "image", "source": source})


# ----------------------------------------------------------------------------- tools
def tool_to_chat(tool: dict[str, Any], at: str, dropped: list[str]) -> dict[str, Any]:
    """A client tool as a chat function tool (a server tool needs an Anthropic upstream)."""
    if tool.get("type") not in (None, "custom"):
        raise BadRequestError(f"{at}: server tool '{tool.get('type')}' needs an Anthropic upstream", param=at)
    note_cache(tool, dropped)
    fn: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def tools_to_anthropic(tools: Any) -> list[dict[str, Any]]:
    """Chat function tools as Anthropic tools."""
    if not isinstance(tools, list):
        raise BadRequestError("'tools' must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise unsupported("tools other than functions", f"tools[{k}].type")
        if not isinstance(fn.get("name"), str):
            raise BadRequestError("tools need a 'function.name'", param=f"tools[{k}].function.name")
        params = fn.get("parameters")
        converted: dict[str, Any] = {
            "name": fn["name"],
            "input_schema": params if isinstance(params, dict) else {"type": "object", "properties": {}},
        }
        if isinstance(fn.get("description"), str):
            converted["description"] = fn["description"]
        out.append(_keep_cache(tool, converted))
    return out


# ----------------------------------------------------------------------------- tool choice
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # Anthropic type -> chat
_CHAT_TOOL_CHOICES = {chat: kind for kind, chat in _TOOL_CHOICES.items()}


def tool_choice_to_chat(choice: dict[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return _TOOL_CHOICES.get(kind, "auto")


def tool_choice_to_anthropic(choice: Any, parallel: Any) -> dict[str, Any] | None:
    """``tool_choice`` and ``parallel_tool_calls`` as Anthropic's ``tool_choice``."""
    result: dict[str, Any] | None
    if choice is None:
        result = None
    elif isinstance(choice, str) and choice in _CHAT_TOOL_CHOICES:
        result = {"type": _CHAT_TOOL_CHOICES[choice]}
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
        and isinstance(choice["function"].get("name"), str)
    ):
        result = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise BadRequestError("unsupported tool_choice", param="tool_choice")
    if parallel is False:
        if result is None:
            result = {"type": "auto"}
        if result["type"] != "none":
            result["disable_parallel_tool_use"] = True
    return result


# ----------------------------------------------------------------------------- tool calls
def tool_call(call_id: Any, name: Any, arguments: str) -> dict[str, Any]:
    """A chat tool call (an item of ``tool_calls``): a function and its JSON arguments."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_use(use_id: Any, name: Any, tool_input: Any) -> dict[str, Any]:
    """An Anthropic ``tool_use`` block."""
    return {"type": "tool_use", "id": use_id, "name": name, "input": tool_input}


def tool_use_to_chat(block: dict[str, Any], at: str) -> dict[str, Any]:
    """A request's ``tool_use`` block as a chat tool call."""
    args = json.dumps(block.get("input") or {}, ensure_ascii=False)
    name = required_str(block, "name", at)
    return tool_call(required_str(block, "id", at), name, args)


def tool_call_to_anthropic(call: Any, where: str) -> dict[str, Any]:
    """A request's chat tool call as a ``tool_use`` block (its arguments must be a JSON object)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(fn, dict):
        raise unsupported("tool calls other than functions", where)
    if not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
        raise BadRequestError("tool calls need an 'id' and a 'function.name'", param=where)
    arguments = fn.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise BadRequestError(
            "tool call arguments must be a JSON object encoded as a string",
            param=f"{where}.function.arguments",
        )
    return tool_use(call["id"], fn["name"], parsed)


def assistant_message(texts: list[str], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat assistant message of the texts (joined; none: null content) and tool calls."""
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    return out


# ----------------------------------------------------------------------------- tool results
def tool_result_to_chat(block: dict[str, Any], at: str) -> dict[str, Any]:
    """A ``tool_result`` block (text only) as a chat ``tool`` message; an error says so."""
    call_id = required_str(block, "tool_use_id", at)
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        text = "\n\n".join(str(b.get("text", "")) for b in content)
    else:
        raise BadRequestError(f"{at}.content: only text tool results can be sent here", param=f"{at}.content")
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": f"Error: {text}" if block.get("is_error") else text,
    }


def tool_message_to_anthropic(msg: dict[str, Any], where: str) -> dict[str, Any]:
    """A chat ``tool`` message (text only) as a ``tool_result`` block."""
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str):
        raise BadRequestError("tool messages need a 'tool_call_id'", param=f"{where}.tool_call_id")
    content = msg.get("content")
    result = content if isinstance(content, str) else texts_to_anthropic(content, where, "tool results")
    return {"type": "tool_result", "tool_use_id": call_id, "content": result}
