"""OpenAI chat completions in (``POST /v1/chat/completions``): the wire body is already the
record's body; answers and chunks go out as the upstream gave them."""

from __future__ import annotations

from typing import Any

from gateway.cache.replay import completion_to_chunks
from gateway.core.request import RequestRecord
from gateway.core.types import Usage
from gateway.flow.adapters.base import ChatEncoder, Encoder, Inbound, Upstream, frames_of
from gateway.flow.exchange import Exchange
from gateway.flow.reply import DONE, Reply, sse


class Chat(Inbound):
    def translate(self) -> RequestRecord:
        opts = self.wire.get("stream_options")
        return RequestRecord(
            "chat",
            str(self.wire["model"]),
            self.wire,
            bool(self.wire.get("stream")),
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
            task_header=self.task_header,
        )

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return completion

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        if not self.record.stream:
            return Reply(self.headers(ex), body=raw)
        chunks = [sse(c) for c in completion_to_chunks(cached, self.record.include_usage)]
        return Reply(self.headers(ex), stream=frames_of([*chunks, DONE]))

    def encoder(self, stream: Upstream, ex: Exchange) -> Encoder:
        return ChatChunks(self.record.include_usage)


class ChatChunks(ChatEncoder):
    """Chunks relayed as they came (the usage-only chunk only when the client asked for it)."""

    def __init__(self, include_usage: bool) -> None:
        super().__init__()
        self.include_usage = include_usage

    def first(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        return sse(item)

    def add(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        if not self.include_usage and not item.get("choices") and item.get("usage"):
            return b""  # the usage-only chunk the client did not ask for
        return sse(item)

    async def finish(self, ex: Exchange) -> bytes:
        return DONE

    def error(self, exc: Any) -> bytes:
        return sse(exc.to_body())
