"""What prompt compression saves on recorded request bodies, and whether it keeps the
prompt-cache hit share: the same sequence of requests (one agent session, as an upstream
received it) measured as sent and as the gateway's compression step would send it.

The provider's prompt cache is modelled as prefix caching over the whole prompt (system,
tools, then the messages in order, each in canonical JSON): a request reads from the cache
the longest prefix it shares with an earlier request of the session. That is what OpenAI's
automatic caching and Anthropic's breakpoints both serve at best; a rewrite that moves the
prefix shows up as a lower cached share.

    from load_tests.compression_eval import evaluate
    evaluate(bodies)  # {"before": {...}, "after": {...}, "saved_tokens": ...}"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway.ledger.tokens import count_text
from gateway.protocols.compression import compress

Count = Callable[[str], int]


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt as one string, in the order a provider caches it."""
    parts = [orjson.dumps(body.get(k)).decode() for k in ("system", "instructions", "tools") if body.get(k)]
    seq = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    if isinstance(seq, list):
        parts += [orjson.dumps(m, option=orjson.OPT_SORT_KEYS).decode() for m in seq]
    elif isinstance(seq, str):
        parts.append(seq)
    return "\n".join(parts)


def _common(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cache_share(bodies: Sequence[dict[str, Any]], count: Count) -> dict[str, Any]:
    """Prompt tokens and cached tokens of the session (prefix caching, see the module)."""
    texts = [prompt_text(b) for b in bodies]
    prompt = cached = 0
    for i, text in enumerate(texts):
        prompt += count(text)
        best = max((_common(text, earlier) for earlier in texts[:i]), default=0)
        cached += count(text[:best]) if best else 0
    return {"requests": len(texts), "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 4) if prompt else None}  # fmt: skip


def evaluate(bodies: Sequence[dict[str, Any]], lossless: bool = True, trim_after: int | None = None,
             model: str = "gpt-4o") -> dict[str, Any]:  # fmt: skip
    def count(text: str) -> int:
        return count_text(text, model)

    squeezed, saved = [], 0
    for body in bodies:
        out, changes = compress(body, lossless, trim_after)
        squeezed.append(out)
        saved += sum(count(b) - count(a) for b, a in changes)
    before, after = cache_share(bodies, count), cache_share(squeezed, count)
    return {
        "before": before, "after": after, "saved_tokens": saved,
        "saved_share": round(saved / before["prompt_tokens"], 4) if before["prompt_tokens"] else None,
        "uncached_before": before["prompt_tokens"] - before["cached_tokens"],
        "uncached_after": after["prompt_tokens"] - after["cached_tokens"],
    }  # fmt: skip
