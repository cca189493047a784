"""Legacy completions in (``POST /v1/completions``) over a chat route: the prompt translated
once into a chat body (protocols/openai_completions.py), answers and chunks translated back
into the ``text_completion`` shape. (A model of kind ``completions`` is passed through as it
is by ``pipeline.passthrough``.)"""

from __future__ import annotations

from typing import Any

from gateway.core.request import RequestRecord
from gateway.core.types import Usage
from gateway.flow.adapters.base import ChatChunks, Encoder, Inbound, Upstream
from gateway.flow.exchange import Exchange
from gateway.flow.reply import sse
from gateway.protocols.openai_completions import chunk_from_chat, from_chat, to_chat


class Completions(Inbound):
    endpoint = "completions"

    def translate(self) -> RequestRecord:
        body = to_chat(self.wire)
        opts = body.get("stream_options")
        return self.record_of(body, include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")))

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return from_chat(completion)

    def encoder(self, stream: Upstream | None, ex: Exchange) -> Encoder:
        return TextChunks(self.record.include_usage)


class TextChunks(ChatChunks):
    """Chat chunks as ``text_completion`` chunks (the role-only first delta shows nothing)."""

    def frame(self, chunk: dict[str, Any]) -> bytes:
        out = chunk_from_chat(chunk)
        return sse(out) if out is not None else b""
