"""OpenAI Responses in (``POST /v1/responses``; the wire models are in openai_responses_wire.py):
the translation of a Responses request into an OpenAI chat body (served by any route's
providers through the chat path), and of a chat completion, or a stream of chat chunks, back
into a Response object (the stream events are in openai_responses_events.py).

Translation decisions (Responses -> chat):
- ``input`` (a string, or items) and the stored conversation before it become ``messages``:
  message items with ``input_text``/``output_text``/``input_image`` parts, ``function_call``
  items (assistant ``tool_calls``), ``function_call_output`` items (``tool`` messages).
  ``instructions`` is the first system message; ``developer`` messages are sent as system.
- ``tools`` of type function (and a ``namespace``'s function tools) -> chat tools; so are
  the tools of an ``additional_tools`` input item (Codex sends its tools so for its default
  models), a ``custom`` (free-form) tool as chat's ``custom`` tool; a ``configuration_update``
  item has no place in chat and is named in ``x-switchyard-dropped``;
  ``tool_choice`` as chat spells it; ``text.format`` json_schema/json_object ->
  ``response_format``; ``reasoning.effort`` -> ``reasoning_effort``; ``max_output_tokens`` ->
  ``max_tokens``; ``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``,
  ``prompt_cache_key``, ``safety_identifier`` as they are.
- Reasoning items of earlier turns have no place in chat: they are not sent, and named in the
  reply header ``x-switchyard-dropped`` (as ``truncation`` is; ``include`` is ignored).
- Anything else that cannot be translated (built-in tools such as ``web_search``, file
  inputs, item references, ``background``, ``conversation``, ``prompt``) is a 400 naming the
  field, never a silent drop.
"""

from __future__ import annotations

from typing import Any

from gateway.core.errors import BadRequestError
from gateway.core.types import Usage
from gateway.protocols.ids import random_hex
from gateway.protocols.openai_responses_wire import UNSUPPORTED

Item = dict[str, Any]
_PREFIX = {
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "additional_tools": "at",
    "configuration_update": "cu",
}
_DROPPED = ("truncation",)
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{random_hex(12)}"


# ----------------------------------------------------------------------------- request -> chat
def input_items(body: dict[str, Any]) -> list[Item]:
    """The request's ``input`` as items (a string is one user message), each with an id (what
    the store keeps and ``input_items`` lists)."""
    raw = body.get("input")
    if raw is None:
        return []
    if isinstance(raw, str):
        return [_message("user", [{"type": "input_text", "text": raw}])]
    out: list[Item] = []
    for i, item in enumerate(raw):
        kind = item.get("type") or ("message" if "role" in item else None)
        _check_item(item, kind, f"input[{i}]")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [text_part(part, content)]
            msg = {**item, "type": "message", "content": content, "id": item.get("id") or new_id("msg")}
            out.append({"status": "completed", **msg})
        elif kind in _PREFIX:
            prefix = _PREFIX[kind]
            out.append({"status": "completed", **item, "id": item.get("id") or new_id(prefix)})
        else:
            param = f"input[{i}].type"
            raise BadRequestError(
                f"Input items of type '{kind}' cannot be served by this gateway", param=param
            )
    return out


def upstream_item(item: Item) -> Item:
    """A stored item as a Responses upstream takes it back as input: without the ids the
    gateway gave input messages and tool outputs (OpenAI's input messages carry none)."""
    kind = item.get("type")
    made = kind == "message" and item.get("role") != "assistant"
    made = made or (kind == "function_call_output" and str(item.get("id", "")).startswith("fco_"))
    return {k: v for k, v in item.items() if k != "id"} if made else item


def _bad(param: str, what: str = "") -> BadRequestError:
    return BadRequestError(f"Invalid value for '{param}'{': ' + what if what else ''}", param=param)


def _check_item(item: Item, kind: Any, param: str) -> None:
    """The fields translation reads, with the types it needs (a 400 naming the field)."""
    need: dict[str, type | tuple[type, ...]] = {}
    if kind == "message":
        if item.get("role") not in ("user", "assistant", "system", "developer"):
            raise _bad(f"{param}.role", "expected 'user', 'assistant', 'system' or 'developer'")
        need = {"content": (str, list)}
    elif kind == "function_call":
        need = {"call_id": str, "name": str}
        if not isinstance(item.get("arguments", ""), str):
            raise _bad(f"{param}.arguments", "expected a string")
    elif kind == "function_call_output":
        need = {"call_id": str, "output": (str, list)}
    elif kind == "additional_tools":
        need = {"tools": list}
    for name, types in need.items():
        if not isinstance(item.get(name), types):
            raise _bad(f"{param}.{name}")
    for key in ("content", "output"):
        value = item.get(key)
        if isinstance(value, list) and not all(isinstance(p, dict) for p in value):
            raise _bad(f"{param}.{key}", "expected an array of content parts (objects)")


def text_part(kind: str, text: str) -> Item:
    return (
        {"type": kind, "text": text, "annotations": []}
        if kind == "output_text"
        else {"type": kind, "text": text}
    )


def _message(role: str, content: list[Item]) -> Item:
    return {"type": "message", "id": new_id("msg"), "role": role, "content": content, "status": "completed"}


def to_chat(body: dict[str, Any], items: list[Item], offset: int = 0) -> tuple[dict[str, Any], list[str]]:
    """A validated Responses body and the conversation's items (``offset`` stored history
    items, then this request's input) -> (an OpenAI chat body, the names of what was not
    sent). Errors name ``input[i]`` counted in the request's own input."""
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise BadRequestError(f"'{name}' is not supported by this gateway", param=name)
    dropped = [name for name in _DROPPED if body.get(name) not in (None, "disabled")]
    messages: list[Item] = []
    tools: list[Item] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind == "additional_tools":
            param = f"input[{i - offset}].tools"
            tools += [fn for j, t in enumerate(item["tools"]) for fn in _tools(t, f"{param}[{j}]")]
            continue
        if kind in ("reasoning", "configuration_update"):
            if kind not in dropped:
                dropped.append(kind)
            continue
        _add_item(messages, item, i - offset)
    if not messages:
        raise BadRequestError("Missing required parameter: 'input'", param="input")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for name in (
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "user",
        "prompt_cache_key",
        "safety_identifier",
    ):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        tools = [fn for i, t in enumerate(body["tools"]) for fn in _tools(t, f"tools[{i}]")] + tools
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _response_format((body.get("text") or {}).get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat, dropped


def _add_item(messages: list[Item], item: Item, i: int) -> None:
    kind = item.get("type")
    if kind == "function_call":
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item.get("arguments") or ""},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = "".join(_part_text(p, f"input[{i}].output") for p in output)
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output or ""})
    else:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequestError(f"Invalid value for 'input[{i}].role'", param=f"input[{i}].role")
        parts = item["content"]
        if role == "assistant":
            text = "".join(_part_text(p, f"input[{i}].content") for p in parts)
            messages.append({"role": "assistant", "content": text})
        elif all(p.get("type") in ("input_text", "output_text") for p in parts):
            text = "".join(str(p.get("text", "")) for p in parts)
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        else:
            content = [_chat_part(p, f"input[{i}].content[{j}]") for j, p in enumerate(parts)]
            messages.append({"role": "system" if role == "developer" else role, "content": content})


def _part_text(part: Item, param: str) -> str:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return str(part.get("text", ""))
    if kind == "refusal":
        return str(part.get("refusal", ""))
    raise BadRequestError(f"Content parts of type '{kind}' cannot be sent here", param=param)


def _chat_part(part: Item, param: str) -> Item:
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image: Item = {"url": part["image_url"]}
        if part.get("detail") in ("low", "high", "auto"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    what = "images by file_id" if kind == "input_image" else f"content parts of type '{kind}'"
    raise BadRequestError(f"This gateway cannot translate {what}", param=f"{param}.type")


def _tools(tool: Item, param: str) -> list[Item]:
    """A function tool, or a namespace's function tools (their calls come back with the
    namespace named: see ``namespaces``)."""
    if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
        return [_tool(t, f"{param}.tools[{j}]") for j, t in enumerate(tool["tools"])]
    return [_tool(tool, param)]


def namespaces(tools: Any) -> dict[str, str]:
    """Function name -> the namespace tool it was declared in."""
    out: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for t in tool["tools"]:
                if isinstance(t, dict) and isinstance(t.get("name"), str):
                    out[t["name"]] = str(tool.get("name"))
    return out


def _tool(tool: Any, param: str) -> Item:
    if not isinstance(tool, dict):
        raise _bad(param, "expected a tool object")
    if tool.get("type") == "custom" and isinstance(tool.get("name"), str):
        custom = {k: tool[k] for k in ("name", "description", "format") if tool.get(k) is not None}
        return {"type": "custom", "custom": custom}
    if tool.get("type") != "function":
        kind = tool.get("type")
        raise BadRequestError(f"Built-in tools such as '{kind}' are not supported", param=f"{param}.type")
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise BadRequestError(f"Missing required parameter: '{param}.name'", param=f"{param}.name")
    fn: Item = {"name": tool["name"]}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            fn[name] = tool[name]
    return {"type": "function", "function": fn}


def _tool_choice(choice: str | Item) -> str | Item:
    if isinstance(choice, str):
        if choice in ("auto", "none", "required"):
            return choice
        raise BadRequestError(f"Invalid value for 'tool_choice': {choice!r}", param="tool_choice")
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequestError("Only function tool choices are supported", param="tool_choice.type")


def _response_format(fmt: Any) -> Item | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise BadRequestError("Invalid value for 'text.format'", param="text.format.type")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.get("schema"), dict) or not isinstance(fmt.get("name"), str):
        raise BadRequestError(
            "'text.format' json_schema needs 'name' and 'schema'", param="text.format.schema"
        )
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": schema}


# ----------------------------------------------------------------------------- chat -> Response
def usage_object(usage: Usage) -> Item:
    inp, out = usage.input_tokens or 0, usage.output_tokens or 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens or 0,
            "cache_write_tokens": usage.cache_write_tokens or 0,
        },
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": inp + out,
    }


def skeleton(body: dict[str, Any], rid: str, created_at: int) -> Item:
    """The Response object before its output: the request's settings echoed back."""
    text = body.get("text") or {}
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "model": body["model"],
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature"),
        "text": {**text, "format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "usage": None,
    }


def finished(response: Item, output: list[Item], finish: str | None, usage: Usage) -> Item:
    reason = _INCOMPLETE.get(finish or "")
    return {
        **response,
        "status": "incomplete" if reason else "completed",
        "incomplete_details": {"reason": reason} if reason else None,
        "output": output,
        "usage": usage_object(usage),
    }


def reasoning_item(text: str, status: str = "completed") -> Item:
    content = [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": content, "status": status}


def output_items(message: dict[str, Any], ns: dict[str, str] | None = None) -> list[Item]:
    """A chat ``message`` -> the Response's output items (the upstream's reasoning text, a
    message item, function calls)."""
    out: list[Item] = []
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought:
        out.append(reasoning_item(thought))
    parts: list[Item] = []
    if message.get("content"):
        parts.append(text_part("output_text", str(message["content"])))
    if message.get("refusal"):
        parts.append({"type": "refusal", "refusal": str(message["refusal"])})
    if parts:
        out.append({**_message("assistant", parts)})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        item = function_call_item(
            str(call.get("id") or new_id("call")), str(fn.get("name")), fn.get("arguments")
        )
        out.append(in_namespace(item, ns or {}))
    return out


def in_namespace(item: Item, ns: dict[str, str]) -> Item:
    if item["name"] in ns:
        item["namespace"] = ns[item["name"]]
    return item


def function_call_item(call_id: str, name: str, arguments: Any, status: str = "completed") -> Item:
    args = arguments if isinstance(arguments, str) else ""
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


def from_chat(
    body: dict[str, Any], completion: dict[str, Any], rid: str, created_at: int, usage: Usage
) -> Item:
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    output = output_items(choice.get("message") or {}, namespaces(body.get("tools")))
    return finished(skeleton(body, rid, created_at), output, choice.get("finish_reason"), usage)
