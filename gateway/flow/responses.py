"""OpenAI Responses requests (``POST /v1/responses``) and the stored responses behind
``previous_response_id`` (retrieve, delete, input items).

A request is translated once into a chat body (protocols/openai_responses.py), then takes the
chat steps (plan, rate limits, exact and semantic cache, classifier, budget reservation,
attempts on any route's providers, metering) with the ledger endpoint ``responses``; the
answer, or the stream of chunks, is translated back into a Response or its typed events.
A stored response is written, and the ledger row committed, before the client sees the end
(the last byte of the JSON body, or ``response.completed``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from gateway.cache.replay import StreamAssembler, completion_to_chunks
from gateway.core.errors import NotFoundError, SwitchyardError
from gateway.core.ports import Provider, ResponsesStream, ResponsesUpstream, StoredResponse
from gateway.core.types import ChatRequest, ChatStream, RawResult, Target
from gateway.flow import caching
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.pipeline import _classify, admit, guarded, reserve
from gateway.flow.reply import Reply, headers
from gateway.flow.services import Services
from gateway.flow.stream import END, Encoded, Frames, on_close, open_first, relay_frames
from gateway.flow.upstream import attempt, estimate, metered
from gateway.protocols.openai_responses import (
    Item,
    from_chat,
    input_items,
    new_id,
    skeleton,
    to_chat,
    upstream_item,
)
from gateway.protocols.openai_responses_events import EventEncoder, frame, raw_frame
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan
from gateway.routing.sticky import conversation_key

log = logging.getLogger("switchyard")


@dataclass(slots=True)
class _Turn:
    """One Responses request: its body, its own input items, the stored conversation before
    them, and the chat body they translate to."""

    body: dict[str, Any]
    items: list[Item]
    history: list[Item]
    chat: dict[str, Any]
    dropped: list[str]
    rid: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def store(self) -> bool:
        return self.body.get("store") is not False

    def skeleton(self) -> Item:
        return skeleton(self.body, self.rid, self.created_at)

    @property
    def previous(self) -> str | None:
        prev = self.body.get("previous_response_id")
        return prev if isinstance(prev, str) else None

    def upstream_body(self) -> dict[str, Any]:
        """What a Responses upstream gets: the client's body (only ``model`` is replaced, by
        the provider); a chain the gateway stores is sent whole (the stored items, then this
        input) instead of ``previous_response_id``, so it continues on any route."""
        if self.previous is None:
            return self.body
        raw = self.body["input"]
        own = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
        out = {k: v for k, v in self.body.items() if k != "previous_response_id"}
        out["input"] = [*map(upstream_item, self.history), *own]
        return out

    def relinked(self, response: Item) -> Item:
        """The upstream's Response with the chain the client named (the upstream saw none)."""
        if self.previous is None:
            return response
        return {**response, "previous_response_id": self.previous}

    def relinked_event(self, raw: bytes, data: Item) -> bytes:
        response = data.get("response")
        if self.previous is None or not isinstance(response, dict):
            return raw
        return orjson.dumps({**data, "response": self.relinked(response)})


def _not_found(rid: str, param: str | None = None) -> NotFoundError:
    return NotFoundError(f"No response found with id '{rid}'.", param=param, code="response_not_found")


async def _turn(svc: Services, body: dict[str, Any], ex: Exchange) -> _Turn:
    history: list[Item] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        found = await svc.responses.conversation(ex.principal.tenant, prev) if svc.responses else None
        if found is None:
            raise _not_found(prev, "previous_response_id")
        history = found
    items = input_items(body)
    chat, dropped = to_chat(body, [*history, *items], offset=len(history))
    return _Turn(body, items, history, chat, dropped)


def _headers(ex: Exchange, turn: _Turn, native: bool = False) -> dict[str, str]:
    out = headers(ex)
    if turn.dropped and not native:
        out["x-switchyard-dropped"] = ",".join(turn.dropped)
    return out


async def _save(svc: Services, turn: _Turn, response: Item, ex: Exchange) -> None:
    if turn.store and svc.responses is not None:
        await svc.responses.put(
            ex.principal.tenant, response, turn.items, turn.body.get("previous_response_id")
        )


# --------------------------------------------------------------------------- create
def _native(svc: Services, target: Target | None) -> bool:
    """The target's provider speaks the Responses API (policy ``providers.X.responses``)."""
    provider = svc.policy.providers.get(target.provider) if target is not None else None
    return provider is not None and provider.speaks_responses


async def create(svc: Services, body: dict[str, Any], ex: Exchange) -> Reply:
    ex.endpoint, ex.requested, ex.stream = "responses", str(body["model"]), bool(body.get("stream"))
    async with guarded(svc, ex):
        turn = await _turn(svc, body, ex)
        plan = await admit(svc, body["model"], ex, "chat", turn.chat)  # + the reservation (Redis)
        # a previous_response_id chain keeps its leading messages, so it keeps its model too
        ex.conversation = conversation_key(ex.principal.tenant, plan.name, turn.chat)
        chat = turn.chat = apply_params(turn.chat, plan.policy.params)
        # A cached chat answer would lose what a pass-through keeps (reasoning items, unknown
        # fields): routes that may pass through skip the caches.
        passes = any(_native(svc, t) for t in plan.targets)
        key = None if passes else caching.cache_key(svc, plan, chat, ex)
        if key is not None and ex.cache == "miss":
            hit = await caching.cache_get(svc, key, ex)
            if hit is not None:
                return await _replay(svc, hit, turn, ex, "hit")
            sem = await caching.semantic_get(svc, plan, chat, ex)
            if sem is not None and sem.lookup.payload is not None:
                return await _replay(svc, sem.lookup.payload, turn, ex, "semantic_hit")
        plan = await _classify(svc, plan, chat, ex)
        plan = await reserve(svc, plan, chat, ex)
        if ex.stream:
            return await _open_stream(svc, plan, turn, ex, key)
        result = await attempt(svc, plan, ex, lambda p, t, s: _call(svc, turn, p, t, s))
        native = _native(svc, ex.target)
        if native:
            ex.usage = metered(svc, chat, None, ex, result.usage)
            response = turn.relinked(result.body)
        else:
            ex.usage = result.usage
            if result.usage.input_tokens is None or result.usage.output_tokens is None:
                ex.usage = estimate(chat, result.body, ex, result.usage)
            if key is not None and caching.cacheable(result.body):
                caching.store(svc, plan, ex, key, orjson.dumps(result.body))
            response = from_chat(turn.body, result.body, turn.rid, turn.created_at, ex.usage)
        await _save(svc, turn, response, ex)
    record(svc, ex)
    return await durable(ex, Reply(_headers(ex, turn, native), body=orjson.dumps(response)))


async def _call(svc: Services, turn: _Turn, provider: Provider, target: Target, timeout: float) -> RawResult:
    if _native(svc, target):
        return await cast(ResponsesUpstream, provider).responses(turn.upstream_body(), target, timeout)
    result = await provider.chat(turn.chat, target, timeout)
    return RawResult(result.body, result.usage)


async def _replay(svc: Services, hit: bytes, turn: _Turn, ex: Exchange, status: str) -> Reply:
    """A cached chat answer as a Response (or its events); metered at cost 0 by caching.replay."""
    hit = caching.unwrap(hit, ex)  # the answer's JSON; who produced it goes on ex.origin
    caching.replay(svc, hit, ChatRequest(turn.chat, stream=False, include_usage=False), ex, status)
    completion = orjson.loads(hit)
    if not ex.stream:
        response = from_chat(turn.body, completion, turn.rid, turn.created_at, ex.usage)
        await _save(svc, turn, response, ex)
        return await durable(ex, Reply(_headers(ex, turn), body=orjson.dumps(response)))
    encoder = EventEncoder(turn.skeleton())
    events = list(encoder.start())
    for chunk in completion_to_chunks(completion, False):
        events.extend(encoder.add(chunk))
    events.extend(encoder.finish(ex.usage))
    await _save(svc, turn, encoder.response, ex)
    await durable(ex, None)

    async def frames() -> AsyncIterator[bytes]:
        for event in events:
            yield frame(event)

    return Reply(_headers(ex, turn), stream=frames())


# --------------------------------------------------------------------------- streams
async def _open_stream(svc: Services, plan: RoutePlan, turn: _Turn, ex: Exchange, key: str | None) -> Reply:
    async def open_stream(
        provider: Provider, target: Target, timeout: float, idle: float
    ) -> ChatStream | ResponsesStream:
        if _native(svc, target):
            upstream = cast(ResponsesUpstream, provider)
            return await upstream.responses_stream(turn.upstream_body(), target, timeout, idle)
        return await provider.chat_stream(turn.chat, target, timeout, idle)

    stream, iterator, first = await open_first(svc, plan, ex, open_stream)
    native = _native(svc, ex.target)
    close = on_close(svc, ex, stream, lambda: stream.usage or estimate(turn.chat, None, ex, None))
    if native:
        encoded = _passed_through(svc, cast(ResponsesStream, stream), iterator, first, turn, ex)
    else:
        encoded = _translated(svc, plan, cast(ChatStream, stream), iterator, first, turn, ex, key)
    relayed = relay_frames(svc, plan, ex, stream, encoded)
    return Reply(_headers(ex, turn, native), stream=relayed, on_close=close)


def _translated(
    svc: Services,
    plan: RoutePlan,
    stream: ChatStream,
    iterator: AsyncIterator[dict[str, Any]],
    first: dict[str, Any],
    turn: _Turn,
    ex: Exchange,
    key: str | None,
) -> Encoded:
    """Chat chunks as the typed Responses events; the row committed before response.completed."""
    encoder = EventEncoder(turn.skeleton())
    assembler = StreamAssembler()

    async def frames() -> Frames:
        for event in encoder.start():
            yield frame(event)
        assembler.add(first)
        for event in encoder.add(first):
            yield frame(event)
        async for chunk in iterator:
            assembler.add(chunk)
            for event in encoder.add(chunk):
                yield frame(event)
        yield END

    async def finish() -> list[bytes]:
        completion = assembler.completion()
        ex.usage = stream.usage or estimate(turn.chat, completion, ex, None)
        events = list(encoder.finish(ex.usage))
        await _save(svc, turn, encoder.response, ex)
        record(svc, ex)
        await durable(ex, None)  # the ledger row is committed before response.completed
        if key is not None and caching.cacheable(completion):
            caching.store(svc, plan, ex, key, orjson.dumps(completion))
        return [frame(event) for event in events]

    return Encoded(
        frames(),
        finish,
        error=lambda exc: frame(encoder.error(exc)),
        usage=lambda: stream.usage or estimate(turn.chat, assembler.completion(), ex, None),
    )


def _passed_through(
    svc: Services,
    stream: ResponsesStream,
    iterator: AsyncIterator[tuple[str, bytes, dict[str, Any]]],
    first: tuple[str, bytes, dict[str, Any]],
    turn: _Turn,
    ex: Exchange,
) -> Encoded:
    """The upstream's typed events as they came (only ``previous_response_id`` put back into
    the Response objects when the gateway resolved the chain); the row committed, and the
    response stored, before the terminal event goes out."""
    seq = [-1]

    def one(kind: str, raw: bytes, data: dict[str, Any]) -> bytes:
        if isinstance(data.get("sequence_number"), int):
            seq[0] = data["sequence_number"]
        return raw_frame(kind, turn.relinked_event(raw, data))

    async def frames() -> Frames:
        yield one(*first)
        async for kind, raw, data in iterator:
            if stream.response is not None:  # the terminal event is next: the row first
                yield END
            yield one(kind, raw, data)

    async def finish() -> list[bytes]:
        response = turn.relinked(stream.response or {})
        ex.usage = metered(svc, turn.chat, None, ex, stream.usage)
        if response.get("status") == "failed":
            ex.status, ex.http_status, ex.error_code = "error", 502, "upstream_failed"
        else:
            await _save(svc, turn, response, ex)
        record(svc, ex)
        await durable(ex, None)
        return []

    def error(exc: SwitchyardError) -> bytes:
        event = {"type": "error", "sequence_number": seq[0] + 1, "code": exc.code}
        return frame({**event, "message": exc.message, "param": exc.param})

    return Encoded(frames(), finish, error, usage=lambda: metered(svc, turn.chat, None, ex, stream.usage))


# --------------------------------------------------------------------------- stored responses
async def _stored(svc: Services, tenant: str, rid: str) -> StoredResponse:
    stored = await svc.responses.get(tenant, rid) if svc.responses is not None else None
    if stored is None:
        raise _not_found(rid)
    return stored


async def retrieve(svc: Services, tenant: str, rid: str) -> Item:
    return (await _stored(svc, tenant, rid)).response


async def delete(svc: Services, tenant: str, rid: str) -> Item:
    if svc.responses is None or not await svc.responses.delete(tenant, rid):
        raise _not_found(rid)
    return {"id": rid, "object": "response.deleted", "deleted": True}


async def list_input_items(
    svc: Services, tenant: str, rid: str, *, limit: int = 20, order: str = "desc", after: str | None = None
) -> Item:
    """``GET /v1/responses/{id}/input_items``: the request's own input items, a list object."""
    items = list((await _stored(svc, tenant, rid)).input_items)
    if order != "asc":
        items.reverse()
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
