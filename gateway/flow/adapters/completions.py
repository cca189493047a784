"""Legacy completions in (``POST /v1/completions``) over a chat route: the prompt translated
once into a chat body (protocols/openai_completions.py), answers and chunks translated back
into the ``text_completion`` shape. (A model of kind ``completions`` is passed through as it
is by ``pipeline.passthrough``.)"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.cache.replay import completion_to_chunks
from gateway.core.request import RequestRecord
from gateway.core.types import Usage
from gateway.flow.adapters.base import ChatEncoder, Encoder, Inbound, Upstream, frames_of
from gateway.flow.exchange import Exchange
from gateway.flow.reply import DONE, Reply, sse
from gateway.protocols.openai_completions import chunk_from_chat, from_chat, to_chat


class Completions(Inbound):
    endpoint = "completions"

    def translate(self) -> RequestRecord:
        body = to_chat(self.wire)
        opts = body.get("stream_options")
        return RequestRecord(
            "completions",
            str(self.wire["model"]),
            body,
            bool(body.get("stream")),
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
            task_header=self.task_header,
        )

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return from_chat(completion)

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        if not self.record.stream:
            return Reply(self.headers(ex), body=orjson.dumps(from_chat(cached)))
        chunks = completion_to_chunks(cached, self.record.include_usage)
        frames = [sse(out) for out in map(chunk_from_chat, chunks) if out is not None]
        return Reply(self.headers(ex), stream=frames_of([*frames, DONE]))

    def encoder(self, stream: Upstream, ex: Exchange) -> Encoder:
        return TextChunks(self.record.include_usage)


class TextChunks(ChatEncoder):
    """Chat chunks as ``text_completion`` chunks."""

    def __init__(self, include_usage: bool) -> None:
        super().__init__()
        self.include_usage = include_usage

    def first(self, item: dict[str, Any]) -> bytes:
        return self.add(item)

    def add(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        if not self.include_usage and not item.get("choices") and item.get("usage"):
            return b""
        out = chunk_from_chat(item)
        return sse(out) if out is not None else b""

    async def finish(self, ex: Exchange) -> bytes:
        return DONE

    def error(self, exc: Any) -> bytes:
        return sse(exc.to_body())
