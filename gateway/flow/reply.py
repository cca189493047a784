"""What the flow hands the HTTP layer: a JSON body or an SSE stream, and the headers that say
how the request was served."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.flow.exchange import Exchange

DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class Reply:
    """What the API layer renders: a JSON body or an SSE byte stream, plus headers."""

    headers: dict[str, str]
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    status: int = 200
    # For streams: the API layer awaits this once the response is over, however it ended. It
    # releases the upstream and records the request if the stream was never iterated (the
    # client left before the first byte).
    on_close: Callable[[], Awaitable[None]] | None = None


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def headers(ex: Exchange) -> dict[str, str]:
    out = {
        "x-request-id": ex.request_id,
        "x-switchyard-cache": "bypass" if ex.cache in ("off", "bypass") else ex.cache,
    }
    if ex.cache == "semantic_hit" and ex.semantic is not None:
        out["x-switchyard-cache"] = "semantic"
        out["x-switchyard-semantic-score"] = f"{ex.semantic.lookup.score:.3f}"
    if ex.plan is not None:
        out["x-switchyard-route"] = ex.plan.name
    if ex.compressed_tokens is not None:
        out["x-switchyard-compressed-tokens"] = str(ex.compressed_tokens)
    if ex.cascade is not None:
        out["x-switchyard-cascade"] = ex.cascade
    if ex.target is not None:
        out["x-switchyard-model"] = ex.target.model
        out["x-switchyard-provider"] = ex.target.provider
        out["x-switchyard-attempts"] = str(ex.attempts)
    elif ex.origin is not None:  # a cache hit: the model and provider that produced the answer
        out["x-switchyard-model"], out["x-switchyard-provider"] = ex.origin
    return out
