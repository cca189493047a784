"""Anthropic Messages in (``POST /v1/messages``). Two ways to each target:

- an Anthropic upstream gets the client's body as it is (``model`` replaced by the provider,
  the route's params applied under Anthropic's names: thinking blocks and signatures,
  ``cache_control`` breakpoints, beta features and unknown fields untouched) and its answer
  or event stream comes back as it is;
- any other upstream gets the request translated to chat (protocols/anthropic_messages.py)
  and its answer translated back, streams included.

The record's body is the whole request as chat (``to_chat(strict=False)``: system, tools,
tool results and blocks a chat upstream cannot take all counted), so budgets, keys, the
classifier and stickiness see a Messages request as its chat twin. Cached answers are
Anthropic messages (a native answer keeps what chat has no place for)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import orjson

from gateway.core.errors import BadRequestError
from gateway.core.ports import MessagesUpstream, Provider
from gateway.core.request import RequestRecord
from gateway.core.types import Target, Usage, usage_from_anthropic
from gateway.flow.adapters.base import Answer, ChatEncoder, Encoder, Inbound, Upstream, frames_of
from gateway.flow.exchange import Exchange
from gateway.flow.reply import Reply
from gateway.protocols.anthropic_assemble import MessageAssembler
from gateway.protocols.anthropic_events import ChunkEncoder, frame, message_frames
from gateway.protocols.anthropic_messages import cache_breakpoints, error_body, from_chat, to_chat
from gateway.routing.params import ANTHROPIC_NAMES, apply_params

MAX_BREAKPOINTS = 4  # Anthropic's limit of cache_control markers per request
CACHEABLE_STOPS = ("end_turn", "tool_use", "max_tokens", "stop_sequence")
FORWARDED = ("anthropic-version", "anthropic-beta")


class Messages(Inbound):
    endpoint = "messages"
    answers = "messages"
    names = ANTHROPIC_NAMES

    @property
    def forwarded(self) -> Mapping[str, str]:
        return {name: self.headers_in[name] for name in FORWARDED if name in self.headers_in}

    def translate(self) -> RequestRecord:
        if cache_breakpoints(self.wire) > MAX_BREAKPOINTS:
            raise BadRequestError(f"A request may carry at most {MAX_BREAKPOINTS} cache_control breakpoints")
        body, dropped = to_chat(self.wire, strict=False)
        meta = self.wire.get("metadata")
        user = meta.get("user_id") if isinstance(meta, dict) else None
        return self.record_of(body, dropped=dropped, hint=user)

    def chat_body(self) -> dict[str, Any]:
        """What a chat upstream gets: the strict translation (a block it cannot take is a 400
        naming it), with the route's params."""
        body, dropped = to_chat(self.wire)
        self.record = replace(self.record, dropped=tuple(dropped))
        return apply_params(body, self.params) if self.params is not None else body

    def native(self, target: Target | None) -> bool:
        provider = self.svc.policy.providers.get(target.provider) if target is not None else None
        return provider is not None and provider.type == "anthropic" and not provider.replicas

    def keyed(self) -> dict[str, Any]:
        return {**self.wire, "anthropic-beta": self.headers_in.get("anthropic-beta")}

    # non-streamed ---------------------------------------------------------------
    async def call(self, provider: Provider, target: Target, timeout: float) -> Answer:
        if self.native(target):
            upstream = cast(MessagesUpstream, provider)
            result = await upstream.messages(self.wire, target, timeout, self.forwarded)
            return Answer(result.usage, body=result.body)
        chat = await provider.chat(self.chat_body(), target, timeout)
        return Answer(chat.usage, completion=chat.body)

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return from_chat(completion, self.model, usage)

    def cached(self, answer: Answer, usage: Usage) -> bytes | None:
        message = self.body_of(answer, usage)
        return orjson.dumps(message) if message.get("stop_reason") in CACHEABLE_STOPS else None

    def cached_usage(self, cached: dict[str, Any]) -> Usage | None:
        return usage_from_anthropic(cached.get("usage")) or Usage()

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        if not self.record.stream:
            return Reply(self.headers(ex), body=raw)
        return Reply(self.headers(ex), stream=frames_of(message_frames(cached)))

    # streamed ---------------------------------------------------------------------
    async def open(self, provider: Provider, target: Target, timeout: float, idle: float) -> Upstream:
        if self.native(target):
            upstream = cast(MessagesUpstream, provider)
            return await upstream.messages_stream(self.wire, target, timeout, idle, self.forwarded)
        return await provider.chat_stream(self.chat_body(), target, timeout, idle)

    def encoder(self, stream: Upstream | None, ex: Exchange) -> Encoder:
        if self.native(ex.target):
            return NativeEvents()
        return ChunkEvents(self.model)


class ChunkEvents(ChatEncoder):
    """Chat chunks as Anthropic events; the closing events after the row is committed."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.encoder = ChunkEncoder(model)

    def first(self, item: dict[str, Any]) -> bytes:
        return self.add(item)

    def add(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        return b"".join(self.encoder.add(item))

    async def finish(self, ex: Exchange) -> bytes:
        return b"".join(self.encoder.finish(ex.usage))

    def cached(self, usage: Usage) -> bytes | None:
        message = from_chat(self.assembler.completion(), self.model, usage)
        return orjson.dumps(message) if message.get("stop_reason") in CACHEABLE_STOPS else None

    def error(self, exc: Any) -> bytes:
        return frame("error", error_body(exc))


class NativeEvents:
    """The upstream's events re-framed with their data bytes untouched; ``message_stop``
    goes out after the row is committed."""

    def __init__(self) -> None:
        self.assembler = MessageAssembler()

    def first(self, item: tuple[str, bytes, dict[str, Any]]) -> bytes:
        return self.add(item)

    def add(self, item: tuple[str, bytes, dict[str, Any]]) -> bytes:
        event, raw, data = item
        self.assembler.add(data)
        return frame(event, raw)

    def last(self, item: tuple[str, bytes, dict[str, Any]]) -> bool:
        return item[2].get("type") == "message_stop"

    def completion(self) -> dict[str, Any] | None:
        return None

    async def finish(self, ex: Exchange) -> bytes:
        return b""

    def cached(self, usage: Usage) -> bytes | None:
        message = self.assembler.result()
        if message is None or message.get("stop_reason") not in CACHEABLE_STOPS:
            return None
        return orjson.dumps(message)

    def error(self, exc: Any) -> bytes:
        return frame("error", error_body(exc))
