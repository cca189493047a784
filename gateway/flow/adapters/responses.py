"""OpenAI Responses in (``POST /v1/responses``). The input, after the stored conversation a
``previous_response_id`` names, is translated once into a chat body (protocols/
openai_responses.py). A provider that speaks the Responses API (policy
``providers.X.responses``) gets the client's body (a chain the gateway stores sent whole
instead of the id); any other gets the chat body, its answer or chunks translated back into a
Response or its typed events. The response is stored before the client sees the end (the
last byte of the JSON body, or ``response.completed``)."""

from __future__ import annotations

import time
from typing import Any, cast

import orjson

from gateway.cache.replay import completion_to_chunks
from gateway.core.errors import NotFoundError, SwitchyardError
from gateway.core.ports import Provider, ResponsesStream, ResponsesUpstream
from gateway.core.request import RequestRecord
from gateway.core.types import Target, Usage
from gateway.flow.adapters.base import Answer, ChatEncoder, Encoder, Inbound, Upstream, frames_of
from gateway.flow.exchange import Exchange
from gateway.flow.reply import Reply
from gateway.protocols.openai_responses import Item, from_chat, input_items, new_id, skeleton, to_chat
from gateway.protocols.openai_responses import upstream_item as as_upstream
from gateway.protocols.openai_responses_events import EventEncoder, frame, raw_frame
from gateway.routing.params import RESPONSES_NAMES
from gateway.routing.plan import RoutePlan


def not_found(rid: str, param: str | None = None) -> NotFoundError:
    return NotFoundError(f"No response found with id '{rid}'.", param=param, code="response_not_found")


class Responses(Inbound):
    endpoint = "responses"
    names = RESPONSES_NAMES

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rid = new_id("resp")
        self.created_at = int(time.time())
        self.items: list[Item] = []
        self.history: list[Item] = []

    @property
    def previous(self) -> str | None:
        prev = self.wire.get("previous_response_id")
        return prev if isinstance(prev, str) else None

    async def prepare(self, ex: Exchange) -> None:
        if self.previous is not None:
            store = self.svc.responses
            found = await store.conversation(ex.principal.tenant, self.previous) if store else None
            if found is None:
                raise not_found(self.previous, "previous_response_id")
            self.history = found
        self.items = input_items(self.wire)
        self.record = self.translate()

    def retranslate(self) -> None:
        self.items = input_items(self.wire)
        self.record = self.translate()

    def translate(self) -> RequestRecord:
        chat, dropped = to_chat(self.wire, [*self.history, *self.items], offset=len(self.history))
        return self.record_of(chat, dropped=dropped, hint=self.wire.get("prompt_cache_key"))

    def native(self, target: Target | None) -> bool:
        provider = self.svc.policy.providers.get(target.provider) if target is not None else None
        return provider is not None and provider.speaks_responses

    def cacheable(self, plan: RoutePlan) -> bool:
        # A cached chat answer would lose what a pass-through keeps (reasoning items, unknown
        # fields): routes that may pass through skip the caches.
        return not any(self.native(t) for t in plan.targets)

    def upstream_body(self) -> dict[str, Any]:
        """What a Responses upstream gets: the client's body; a chain the gateway stores is
        sent whole (the stored items, then this input) instead of ``previous_response_id``."""
        if self.previous is None:
            return self.wire
        raw = self.wire["input"]
        own = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
        out = {k: v for k, v in self.wire.items() if k != "previous_response_id"}
        out["input"] = [*map(as_upstream, self.history), *own]
        return out

    def relinked(self, response: Item) -> Item:
        """The upstream's Response with the chain the client named (the upstream saw none)."""
        if self.previous is None:
            return response
        return {**response, "previous_response_id": self.previous}

    async def save(self, response: Item, ex: Exchange) -> None:
        if self.wire.get("store") is not False and self.svc.responses is not None:
            await self.svc.responses.put(ex.principal.tenant, response, self.items, self.previous)

    # non-streamed ---------------------------------------------------------------
    async def call(self, provider: Provider, target: Target, timeout: float) -> Answer:
        if self.native(target):
            upstream = cast(ResponsesUpstream, provider)
            result = await upstream.responses(self.upstream_body(), target, timeout)
            return Answer(result.usage, body=self.relinked(result.body))
        return await super().call(provider, target, timeout)

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        return from_chat(self.wire, completion, self.rid, self.created_at, usage)

    async def render(self, answer: Answer, ex: Exchange) -> bytes:
        response = self.body_of(answer, ex.usage)
        await self.save(response, ex)
        return orjson.dumps(response)

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        if not self.record.stream:
            response = from_chat(self.wire, cached, self.rid, self.created_at, ex.usage)
            await self.save(response, ex)
            return Reply(self.headers(ex), body=orjson.dumps(response))
        encoder = EventEncoder(skeleton(self.wire, self.rid, self.created_at))
        events = list(encoder.start())
        for chunk in completion_to_chunks(cached, False):
            events.extend(encoder.add(chunk))
        events.extend(encoder.finish(ex.usage))
        await self.save(encoder.response, ex)
        return Reply(self.headers(ex), stream=frames_of([frame(e) for e in events]))

    # streamed ---------------------------------------------------------------------
    async def open(self, provider: Provider, target: Target, timeout: float, idle: float) -> Upstream:
        if self.native(target):
            upstream = cast(ResponsesUpstream, provider)
            return await upstream.responses_stream(self.upstream_body(), target, timeout, idle)
        return await super().open(provider, target, timeout, idle)

    def encoder(self, stream: Upstream | None, ex: Exchange) -> Encoder:
        if self.native(ex.target):
            return NativeEvents(self, cast(ResponsesStream, stream))
        return ChunkEvents(self)


class ChunkEvents(ChatEncoder):
    """Chat chunks as the typed Responses events; ``response.completed`` after the row."""

    def __init__(self, call: Responses) -> None:
        super().__init__()
        self.call = call
        self.encoder = EventEncoder(skeleton(call.wire, call.rid, call.created_at))

    def first(self, item: dict[str, Any]) -> bytes:
        opening = b"".join(frame(e) for e in self.encoder.start())
        return opening + self.add(item)

    def add(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        return b"".join(frame(e) for e in self.encoder.add(item))

    async def finish(self, ex: Exchange) -> bytes:
        events = list(self.encoder.finish(ex.usage))
        await self.call.save(self.encoder.response, ex)
        return b"".join(frame(e) for e in events)

    def error(self, exc: SwitchyardError) -> bytes:
        return frame(self.encoder.error(exc))


class NativeEvents:
    """The upstream's typed events as they came (``previous_response_id`` put back into the
    Response objects when the gateway resolved the chain); the row committed, and the
    response stored, before the terminal event goes out."""

    def __init__(self, call: Responses, stream: ResponsesStream) -> None:
        self.call = call
        self.stream = stream
        self.seq = -1

    def first(self, item: tuple[str, bytes, dict[str, Any]]) -> bytes:
        return self.add(item)

    def add(self, item: tuple[str, bytes, dict[str, Any]]) -> bytes:
        kind, raw, data = item
        if isinstance(data.get("sequence_number"), int):
            self.seq = data["sequence_number"]
        response = data.get("response")
        if self.call.previous is not None and isinstance(response, dict):
            raw = orjson.dumps({**data, "response": self.call.relinked(response)})
        return raw_frame(kind, raw)

    def last(self, item: Any) -> bool:
        return self.stream.response is not None

    def completion(self) -> dict[str, Any] | None:
        return None

    async def finish(self, ex: Exchange) -> bytes:
        response = self.call.relinked(self.stream.response or {})
        if response.get("status") == "failed":
            ex.status, ex.http_status, ex.error_code = "error", 502, "upstream_failed"
        else:
            await self.call.save(response, ex)
        return b""

    def cached(self, usage: Usage) -> bytes | None:
        return None

    def error(self, exc: SwitchyardError) -> bytes:
        event = {"type": "error", "sequence_number": self.seq + 1, "code": exc.code}
        return frame({**event, "message": exc.message, "param": exc.param})
