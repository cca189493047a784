"""Anthropic Messages API wire format for the mock (``POST /v1/messages``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from load_tests.mock_reply import (
    Reply,
    anthropic_error,
    count_words,
    generate,
    json_reply,
    last_user_text,
    part_text,
    requested_tool,
    split_fixed,
    stop_list,
)

ARG_PIECE_CHARS = 8
_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence"}


def event(name: str, obj: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def _system_parts(system: Any) -> tuple[str, str]:
    """(whole system text, cacheable prefix text) of a system prompt."""
    if isinstance(system, str):
        return system, ""
    if not isinstance(system, list):
        return "", ""
    texts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in system]
    marks = [i for i, b in enumerate(system) if isinstance(b, dict) and b.get("cache_control")]
    prefix = "\n".join(texts[: marks[-1] + 1]) if marks else ""
    return "\n".join(texts), prefix


def _answers_tool_results(messages: Any) -> bool:
    """The last message carries tool results: a model answers them (an agent's loop ends)."""
    last = messages[-1] if isinstance(messages, list) and messages else None
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _chosen_tool(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or _answers_tool_results(body.get("messages")):
        return None
    if isinstance(choice, dict):
        if choice.get("type") == "none":
            return None
        if choice.get("type") == "tool" and isinstance(choice.get("name"), str):
            return str(choice["name"])
    first = tools[0] if isinstance(tools[0], dict) else {}
    name = first.get("name")
    return name if isinstance(name, str) else "tool"


def messages(
    body: dict[str, Any], headers: Mapping[str, str], tokens: int, rid: int, seen: Callable[[str], bool]
) -> Reply:
    """Answer one Messages API request; ``seen(prefix)`` tells whether a cache prefix was written."""
    if not headers.get("x-api-key") or not headers.get("anthropic-version"):
        return anthropic_error(401, "missing x-api-key or anthropic-version header", "authentication_error")
    model = body.get("model")
    msgs = body.get("messages")
    max_tokens = body.get("max_tokens")
    if not isinstance(model, str) or not model:
        return anthropic_error(400, "model: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return anthropic_error(400, "max_tokens: Field required")
    if not isinstance(msgs, list) or not msgs:
        return anthropic_error(400, "messages: at least one message is required")
    system_text, prefix = _system_parts(body.get("system"))
    total = count_words(system_text) + sum(
        count_words(part_text(m.get("content"))) for m in msgs if isinstance(m, dict)
    )
    cached = count_words(prefix)
    hit = bool(prefix) and seen(model + "\x00" + prefix)
    usage = {
        "input_tokens": total - cached,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0 if hit else cached,
        "cache_read_input_tokens": cached if hit else 0,
    }
    user_text = last_user_text(msgs)
    mid = f"msg_mock{rid:012d}"
    tool = _chosen_tool(body)
    if tool is not None:
        tool_input: dict[str, Any] = {"q": user_text}
        asked = requested_tool(user_text, body.get("tools"))
        if asked is not None:
            tool, tool_input = asked
        pieces = split_fixed(orjson.dumps(tool_input).decode(), ARG_PIECE_CHARS)
        block = {"type": "tool_use", "id": f"toolu_mock{rid:012d}", "name": tool, "input": tool_input}
        return _respond(body, mid, model, usage, block, pieces, "tool_use", None)
    gen = generate(user_text, tokens, max_tokens, stop_list(body.get("stop_sequences")))
    block = {"type": "text", "text": gen.text}
    return _respond(body, mid, model, usage, block, list(gen.pieces), _STOP_REASON[gen.finish], gen.stop_hit)


def _respond(
    body: dict[str, Any],
    mid: str,
    model: str,
    usage: dict[str, int],
    block: dict[str, Any],
    pieces: list[str],
    stop_reason: str,
    stop_sequence: str | None,
) -> Reply:
    usage = {**usage, "output_tokens": len(pieces)}
    if not body.get("stream"):
        msg = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }
        return json_reply(200, msg, dialect="anthropic", n_paced=max(0, len(pieces) - 1))
    start_usage = {**usage, "output_tokens": 1}
    start: dict[str, Any] = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    is_tool = block["type"] == "tool_use"
    empty_block = {**block, "input": {}} if is_tool else {"type": "text", "text": ""}
    events = [
        event("message_start", {"type": "message_start", "message": start}),
        event(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": empty_block}
        ),
        event("ping", {"type": "ping"}),
    ]
    paced = [False, False, False]
    for k, piece in enumerate(pieces):
        delta = (
            {"type": "input_json_delta", "partial_json": piece}
            if is_tool
            else {"type": "text_delta", "text": piece}
        )
        events.append(
            event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
        paced.append(k > 0)
    final = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": {"output_tokens": len(pieces)},
    }
    events += [
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event("message_delta", final),
        event("message_stop", {"type": "message_stop"}),
    ]
    paced += [False, False, False]
    return Reply(
        content_type="text/event-stream; charset=utf-8",
        events=tuple(events),
        paced=tuple(paced),
        dialect="anthropic",
    )


def count_tokens(body: dict[str, Any], headers: Mapping[str, str]) -> Reply:
    """``POST /v1/messages/count_tokens``: the mock's word count of system, messages and tools
    (the same count its answers report as input tokens, plus the tools' JSON words)."""
    if not headers.get("x-api-key") or not headers.get("anthropic-version"):
        return anthropic_error(401, "missing x-api-key or anthropic-version header", "authentication_error")
    msgs = body.get("messages")
    if not isinstance(body.get("model"), str) or not isinstance(msgs, list) or not msgs:
        return anthropic_error(400, "model and messages are required")
    system_text, _ = _system_parts(body.get("system"))
    total = count_words(system_text) + sum(
        count_words(part_text(m.get("content"))) for m in msgs if isinstance(m, dict)
    )
    if body.get("tools"):
        total += count_words(orjson.dumps(body["tools"]).decode().replace('"', " "))
    return json_reply(200, {"input_tokens": total}, dialect="anthropic")


def status_body(status: int, message: str) -> bytes:
    return anthropic_error(status, message).body


def huge_message(model: str, rid: int, size: int) -> Reply:
    msg = {
        "id": f"msg_mock{rid:012d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "x" * size}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 1},
    }
    return json_reply(200, msg, dialect="anthropic")
