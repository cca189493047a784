"""Legacy completions (``POST /v1/completions``).

A model of kind ``completions`` (an upstream that still serves the endpoint) is passed through
as it is, JSON only. Any other route is a chat route: the request is translated once into a
chat body (protocols/openai_completions.py), takes every chat step (plan, limits, exact and
semantic cache, classifier, budget reservation, attempts, metering with the ledger endpoint
``completions``), and the answer, or each chunk of the stream, is translated back into the
``text_completion`` shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.core.errors import BadRequestError
from gateway.flow import pipeline
from gateway.flow.exchange import Exchange
from gateway.flow.reply import DONE, Reply, sse
from gateway.flow.services import Services
from gateway.protocols.openai_chat import chat_request
from gateway.protocols.openai_completions import chunk_from_chat, from_chat, to_chat

_DATA = b"data: "


async def create(svc: Services, body: dict[str, Any], ex: Exchange) -> Reply:
    kind = svc.router.kind_of(body.get("model"))
    if kind is not None and kind != "chat":
        if body.get("stream"):
            raise BadRequestError(
                f"The model '{body['model']}' is served by a completions upstream without streaming;"
                " send 'stream': false",
                param="stream",
            )
        return await pipeline.passthrough(svc, "completions", body, ex)
    reply = await pipeline.chat(svc, chat_request(to_chat(body)), ex, endpoint="completions")
    if reply.stream is not None:
        reply.stream = _chunks(reply.stream)
    elif reply.body is not None and reply.status == 200:
        reply.body = orjson.dumps(from_chat(orjson.loads(reply.body)))
    return reply


def _frame(frame: bytes) -> bytes | None:
    """One chat SSE frame as a completions frame; ``[DONE]`` and error events pass unchanged."""
    if not frame.startswith(_DATA) or frame.startswith(DONE.rstrip()):
        return frame + b"\n\n"
    chunk = orjson.loads(frame[len(_DATA) :])
    if not isinstance(chunk, dict) or "error" in chunk:
        return frame + b"\n\n"
    out = chunk_from_chat(chunk)
    return sse(out) if out is not None else None


async def _chunks(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The chat stream's frames, each translated; closing this closes the chat stream (which
    meters the request however it ended)."""
    pending = b""
    try:
        async for data in frames:
            pending += data
            *whole, pending = pending.split(b"\n\n")
            out = b"".join(f for f in (_frame(w) for w in whole if w) if f is not None)
            if out:
                yield out
        if pending.strip():
            last = _frame(pending.strip())
            if last is not None:
                yield last
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()
