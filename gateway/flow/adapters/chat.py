"""OpenAI chat completions in (``POST /v1/chat/completions``): the wire body is already the
record's body; answers and chunks go out as the upstream gave them."""

from __future__ import annotations

from typing import Any

from gateway.core.request import RequestRecord
from gateway.core.types import Usage
from gateway.flow.adapters.base import ChatChunks, Encoder, Inbound, Upstream
from gateway.flow.exchange import Exchange
from gateway.flow.reply import Reply


class Chat(Inbound):
    def translate(self) -> RequestRecord:
        opts = self.wire.get("stream_options")
        return self.record_of(
            self.wire, include_usage=bool(isinstance(opts, dict) and opts.get("include_usage"))
        )

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return completion

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        if not self.record.stream:
            return Reply(self.headers(ex), body=raw)  # the cached bytes as they are
        return await super().replay(cached, raw, ex)

    def encoder(self, stream: Upstream | None, ex: Exchange) -> Encoder:
        return ChatChunks(self.record.include_usage)
