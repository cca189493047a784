"""Would a cached answer have done for a query that the upstream just answered afresh?

The feedback of the per-entry online thresholds (``online_threshold``) on a band miss: the
candidate's cached completion and the fresh one are compared. The judge is *sound*: it says
"same" only when every choice's text (whitespace and case aside), refusal and tool calls are
identical, which a right candidate gives whenever the model answers the paraphrase with the
same words (short, deterministic answers: classifications, extractions, facts at temperature
0). Anything else, including a payload it cannot read, counts as "not the same", which only
keeps an entry's threshold where it is: it can cost recall, never precision."""

from __future__ import annotations

import json
from typing import Any


def _choices(payload: bytes) -> list[tuple[str, str, str]] | None:
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return None
    out = []
    for choice in body["choices"]:
        msg: Any = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(msg, dict):
            return None
        content = msg.get("content")
        text = " ".join(content.split()).casefold() if isinstance(content, str) else ""
        refusal = msg.get("refusal") if isinstance(msg.get("refusal"), str) else ""
        calls = msg.get("tool_calls") or []
        try:
            tools = json.dumps([c.get("function") for c in calls if isinstance(c, dict)], sort_keys=True)
        except (TypeError, ValueError):
            return None
        out.append((text, str(refusal), tools))
    return out


def same_answer(cached: bytes, fresh: bytes) -> bool:
    """True only when both chat completions say the same thing (see the module docstring)."""
    a, b = _choices(cached), _choices(fresh)
    if not a or not b or len(a) != len(b):
        return False
    if all(text == "" and refusal == "" and tools == "[]" for text, refusal, tools in a):
        return False  # nothing to compare
    return a == b
