"""Reply value and the deterministic text rules shared by the OpenAI and Anthropic mocks.

The reply text is ``"echo: " + <last user text>``, cut or padded (with the word
``pad``) to the configured number of words. Token counts are word counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

PAD_WORD = "pad"


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler wants sent: either a whole body or a list of SSE events.

    ``paced[i]`` says whether an inter-token delay precedes ``events[i]``; a
    non-streaming reply waits ``ttft + itl * n_paced`` before it is sent.
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: tuple[bytes, ...] | None = None
    paced: tuple[bool, ...] = ()
    n_paced: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    dialect: str = "openai"

    @property
    def streaming(self) -> bool:
        return self.events is not None


def json_reply(status: int, obj: Any, *, dialect: str = "openai", n_paced: int = 0) -> Reply:
    return Reply(status=status, body=orjson.dumps(obj), dialect=dialect, n_paced=n_paced)


def openai_error(
    status: int, message: str, etype: str = "invalid_request_error", param: str | None = None
) -> Reply:
    return json_reply(status, {"error": {"message": message, "type": etype, "param": param, "code": None}})


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str, etype: str | None = None) -> Reply:
    kind = etype or ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json_reply(status, body, dialect="anthropic")


def part_text(content: Any) -> str:
    """Text of a message content: a string, a list of parts/blocks, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif "content" in part:  # Anthropic tool_result block
                    texts.append(part_text(part["content"]))
        return " ".join(t for t in texts if t)
    return str(content)


def count_words(text: str) -> int:
    return len(text.split())


def last_user_text(messages: list[Any]) -> str:
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            return part_text(msg.get("content"))
    return ""


@dataclass(frozen=True, slots=True)
class Generated:
    """Words of one reply as stream pieces plus why generation stopped.

    ``finish`` is one of ``stop``, ``length``, ``stop_sequence``; ``stop_hit``
    names the stop string that ended it, if any.
    """

    pieces: tuple[str, ...]
    finish: str
    stop_hit: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def generate(prompt_text: str, tokens: int, max_tokens: int | None, stops: list[str]) -> Generated:
    """Apply the echo rule, the word budget, ``max_tokens`` and stop strings."""
    words = ("echo: " + prompt_text).split()[:tokens]
    words += [PAD_WORD] * (tokens - len(words))
    limit = tokens if max_tokens is None else max(0, min(tokens, max_tokens))
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words[:limit])]
    text = "".join(pieces)
    best: tuple[int, str] | None = None
    for stop in stops:
        if stop:
            at = text.find(stop)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
    if best is not None:
        return Generated(_cut_pieces(pieces, best[0]), "stop_sequence", best[1])
    return Generated(tuple(pieces), "length" if limit < tokens else "stop")


def _cut_pieces(pieces: list[str], at: int) -> tuple[str, ...]:
    out: list[str] = []
    used = 0
    for piece in pieces:
        if used + len(piece) <= at:
            out.append(piece)
            used += len(piece)
            continue
        if at > used:
            out.append(piece[: at - used])
        break
    return tuple(out)


def split_fixed(text: str, size: int) -> list[str]:
    """Cut a string into pieces of ``size`` characters (at least one piece)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stop_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for s in value if isinstance(s, str)]
    return []


_TOOL_MARK = re.compile(r"mock-tool: (\w+) (\{.*\})\s*$", re.S)


def requested_tool(text: str, tools: Any) -> tuple[str, dict[str, Any]] | None:
    """A prompt that ends with ``mock-tool: NAME {json}`` makes the mock call that tool (when
    the request offers it) with that input, so an agent test can make a real tool run."""
    found = _TOOL_MARK.search(text or "")
    if found is None or not isinstance(tools, list):
        return None
    names = {(t.get("function") or {}).get("name") or t.get("name") for t in tools if isinstance(t, dict)}
    if found.group(1) not in names:
        return None
    try:
        args = orjson.loads(found.group(2))
    except orjson.JSONDecodeError:
        return None
    return (found.group(1), args) if isinstance(args, dict) else None
