"""What a semantic-cache entry is keyed on (pure Python; no numpy).

The lookup text is the last user message. Everything else in the request (system prompt,
earlier turns, later messages, tools, tool_choice, response_format, sampling parameters, the
route, the tenant) must match exactly: it is hashed into a *context id*, and an entry is only
ever compared with lookups of the same context id. So the same question asked inside two
different conversations, or under two different system prompts, never shares an answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.cache.keys import canonical_key

_PLACEHOLDER = "\x00switchyard-semantic-lookup\x00"


@dataclass(frozen=True, slots=True)
class SemanticKey:
    context: str  # sha256 hex over everything but the lookup text (tenant and route included)
    text: str  # the last user message


def _text_of(content: Any) -> str | None:
    """Plain text of a message's content; None when it holds anything but text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                return None  # images, audio, files: not something a text embedding can match
            parts.append(part["text"])
        return "\n".join(parts)
    return None


def last_user_index(body: dict[str, Any]) -> int | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, dict) and msg.get("role") == "user":
            return i
    return None


def last_user_text(body: dict[str, Any]) -> str | None:
    """The lookup text: the last user message, when it is plain text and not blank."""
    i = last_user_index(body)
    if i is None:
        return None
    text = _text_of(body["messages"][i].get("content"))
    return text if text is not None and text.strip() else None


def semantic_key(tenant: str, route: str, body: dict[str, Any], protocol: str = "chat") -> SemanticKey | None:
    """The (context id, lookup text) of a chat or Anthropic Messages request (both keep their
    turns in ``messages``), or None when it has no usable text. ``protocol`` is part of the
    context id: a chat answer and a Messages answer differ in shape, so they never meet."""
    text = last_user_text(body)
    i = last_user_index(body)
    if text is None or i is None:
        return None
    messages = list(body["messages"])
    messages[i] = {**messages[i], "content": _PLACEHOLDER}
    context = canonical_key(tenant, route, f"{protocol}-semantic", {**body, "messages": messages})
    return SemanticKey(context, text)
