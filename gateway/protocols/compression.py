"""Prompt compression on a request's wire body (OpenAI chat, Anthropic Messages, OpenAI
Responses): pure functions, no I/O.

Lossless (``lossless``): in what the client and its tools sent (user text, tool results;
never the system prompt nor the model's own turns) a text that is JSON is minified, trailing
spaces are cut from every line and runs of blank lines shortened to one; a text block of
``MIN_REPEAT`` characters or more that repeats an earlier one of the same request is replaced
by a short marker. Each change depends only on the block itself and on what comes before it,
so a request compresses its earlier turns exactly as the previous request did: a provider's
cached prefix does not move.

Lossy (``trim_after``): tool outputs older than the last ``trim_after`` turns that carry tool
outputs are cut to a marked stub. This rewrites earlier turns as the conversation advances,
so it does move the cached prefix: for agent traffic whose tool outputs are large and stale.

``compress`` returns the new body (the input is not changed) and the (before, after) text of
every change, for counting the tokens saved."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

import orjson

MIN_REPEAT: Final = 512  # characters: shorter repeats are left alone
MAX_HEADER_LINES: Final = 8  # lines before a tool output's JSON document, at most
MIN_TRIM: Final = 256  # characters: shorter tool outputs are never trimmed
REPEATED: Final = (
    "[the gateway omitted this block: it repeats an earlier block of this conversation word for word]"
)
_BLANKS: Final = re.compile(r"\n(?:[ \t]*\n){2,}")
_TRAILING: Final = re.compile(r"[ \t]+\n")

Changes = list[tuple[str, str]]


def stub(text: str) -> str:
    return f"[the gateway trimmed this older tool output of {len(text)} characters]"


def _minified(text: str) -> str | None:
    """``text`` minified when all of it is one JSON object or array, else None."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return orjson.dumps(value).decode() if isinstance(value, (dict, list)) else None


def lossless_text(text: str) -> str:
    """``text`` minified when it is JSON, or ends in a JSON document after a few header lines
    (a tool's output: "Exit code: 0\nOutput:\n{...}"); else with trailing spaces and extra
    blank lines cut."""
    if text.lstrip()[:1] in ("{", "["):
        mini = _minified(text)
        if mini is not None:
            return mini if len(mini) < len(text) else text
    start = 0
    for _ in range(MAX_HEADER_LINES):
        start = text.find("\n", start) + 1
        if start <= 0:
            break
        if text[start : start + 1] in ("{", "["):
            mini = _minified(text[start:])
            if mini is not None:
                out = text[:start] + mini
                return out if len(out) < len(text) else text
    out = _TRAILING.sub("\n", text)
    out = _BLANKS.sub("\n\n", out)
    return out


# --------------------------------------------------------------------------- the walk
class _Slot:
    """One text of the body that compression may rewrite: where it is, and whether it is a
    tool output (of which message, for trimming)."""

    __slots__ = ("get", "message", "put", "tool")

    def __init__(self, get: Callable[[], str], put: Callable[[str], None], tool: bool, message: int) -> None:
        self.get, self.put, self.tool, self.message = get, put, tool, message


def _key_slot(holder: dict[str, Any], key: str, tool: bool, message: int) -> _Slot:
    def put(v: str) -> None:
        holder[key] = v

    return _Slot(lambda: str(holder[key]), put, tool, message)


def _blocks(content: Any, tool: bool, message: int) -> Iterator[_Slot]:
    """The texts of a content list (chat parts, Anthropic blocks, Responses input parts)."""
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text") and isinstance(block.get("text"), str):
            yield _key_slot(block, "text", tool, message)
        elif kind == "tool_result":
            inner = block.get("content")
            if isinstance(inner, str):
                yield _key_slot(block, "content", True, message)
            elif isinstance(inner, list):
                yield from _blocks(inner, True, message)


def _slots(body: dict[str, Any]) -> Iterator[_Slot]:
    if isinstance(body.get("prompt"), str):  # a legacy completion: one text
        yield _key_slot(body, "prompt", False, 0)
    messages = body.get("messages")
    if isinstance(messages, list):  # chat or Anthropic Messages
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in ("user", "tool"):
                continue
            tool = msg.get("role") == "tool"
            content = msg.get("content")
            if isinstance(content, str):
                yield _key_slot(msg, "content", tool, i)
            elif isinstance(content, list):
                yield from _blocks(content, tool, i)
    items = body.get("input")
    if isinstance(items, list):  # Responses
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call_output" and isinstance(item.get("output"), str):
                yield _key_slot(item, "output", True, i)
            elif item.get("role") == "user" and item.get("type", "message") == "message":
                content = item.get("content")
                if isinstance(content, str):
                    yield _key_slot(item, "content", False, i)
                elif isinstance(content, list):
                    yield from _blocks(content, False, i)


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    """A copy deep enough to rewrite texts in (messages/input and their content lists)."""
    try:
        out: dict[str, Any] = orjson.loads(orjson.dumps(body))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError):  # an integer past 64 bits
        out = copy.deepcopy(body)
    return out


def compress(body: dict[str, Any], lossless: bool, trim_after: int | None) -> tuple[dict[str, Any], Changes]:
    """The compressed body and the (before, after) of each text changed."""
    out = _copy(body)
    slots = list(_slots(out))
    changes: Changes = []
    recent: set[int] = set()
    if trim_after is not None:
        tool_messages = sorted({s.message for s in slots if s.tool})
        recent = set(tool_messages[-trim_after:]) if trim_after > 0 else set()
    seen: set[str] = set()
    for slot in slots:
        before = slot.get()
        after = before
        if trim_after is not None and slot.tool and slot.message not in recent and len(before) >= MIN_TRIM:
            after = stub(before)
        elif lossless:
            after = lossless_text(before)
            if len(after) >= MIN_REPEAT:
                if after in seen:
                    after = REPEATED
                else:
                    seen.add(after)
        if after != before:
            slot.put(after)
            changes.append((before, after))
    return (out, changes) if changes else (body, changes)
