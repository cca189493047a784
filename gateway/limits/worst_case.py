"""The worst case a request can cost, read from its body alone: a cheap upper bound of the
prompt's tokens, the output it may ask for and how many answers it may be billed for. The
budget gate reserves on these before the upstream call (``gate.Limits.reserve``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

# Prompts larger than this (JSON bytes) reserve their byte bound instead of a tokenizer count:
# tokenizing megabytes on the event loop would stall every other request.
EXACT_PROMPT_BYTES: Final = 64 * 1024


def prompt_token_bound(body: Mapping[str, Any], model: str = "") -> int:
    """A cheap upper bound of the prompt's tokens: the bytes of its JSON (a BPE token covers at
    least one byte, and the JSON framing outweighs the per-message token overhead)."""
    return len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("input") or ""))


def requested_max_output(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def output_multiplier(body: Mapping[str, Any]) -> int:
    """How many answers of up to max_tokens one request may be billed for: ``n`` choices (or
    ``best_of`` candidates, the larger), for each prompt of a batched /v1/completions call."""
    answers = max(_count(body.get("n")), _count(body.get("best_of")))
    prompt = body.get("prompt")
    prompts = 1
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompts = len(prompt)  # a list of strings or of token lists: one answer set each
    return answers * prompts
