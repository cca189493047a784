"""OpenAI Responses requests (``POST /v1/responses``) and the stored responses behind
``previous_response_id`` (retrieve, delete, input items).

A request is translated once into a chat body (protocols/openai_responses.py), then takes the
chat steps (plan, rate limits, exact and semantic cache, classifier, budget reservation,
attempts on any route's providers, metering) with the ledger endpoint ``responses``; the
answer, or the stream of chunks, is translated back into a Response or its typed events.
A stored response is written, and the ledger row committed, before the client sees the end
(the last byte of the JSON body, or ``response.completed``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.cache.replay import StreamAssembler, completion_to_chunks
from gateway.core.errors import (
    InternalError,
    NotFoundError,
    StreamBrokenError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.core.ports import Provider, StoredResponse
from gateway.core.redact import redact
from gateway.core.types import ChatRequest, ChatStream, Target
from gateway.flow import caching
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.pipeline import _classify, admit, guarded, reserve
from gateway.flow.reply import Reply, headers
from gateway.flow.services import Services
from gateway.flow.stream import YIELD_EVERY
from gateway.flow.upstream import attempt, estimate
from gateway.protocols.openai_responses import Item, from_chat, input_items, new_id, skeleton, to_chat
from gateway.protocols.openai_responses_events import EventEncoder, frame
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


def _headers(ex: Exchange, turn: _Turn) -> dict[str, str]:
    out = headers(ex)
    if turn.dropped:
        out["x-switchyard-dropped"] = ",".join(turn.dropped)
    return out


async def _save(svc: Services, turn: _Turn, response: Item, ex: Exchange) -> None:
    if turn.store and svc.responses is not None:
        await svc.responses.put(
            ex.principal.tenant, response, turn.items, turn.body.get("previous_response_id")
        )


# --------------------------------------------------------------------------- create
async def create(svc: Services, body: dict[str, Any], ex: Exchange) -> Reply:
    ex.endpoint, ex.requested, ex.stream = "responses", str(body["model"]), bool(body.get("stream"))
    async with guarded(svc, ex):
        turn = await _turn(svc, body, ex)
        plan = await admit(svc, body["model"], ex, "chat")
        # a previous_response_id chain keeps its leading messages, so it keeps its model too
        ex.conversation = conversation_key(ex.principal.tenant, plan.name, turn.chat)
        chat = turn.chat = apply_params(turn.chat, plan.policy.params)
        key = caching.cache_key(svc, plan, chat, ex)
        if key is not None and ex.cache == "miss":
            hit = await caching.cache_get(svc, key)
            if hit is not None:
                return await _replay(svc, hit, turn, ex, "hit")
            sem = await caching.semantic_get(svc, plan, chat, ex)
            if sem is not None and sem.lookup.payload is not None:
                return await _replay(svc, sem.lookup.payload, turn, ex, "semantic_hit")
        plan = await _classify(svc, plan, chat, ex)
        plan = await reserve(svc, plan, chat, ex)
        if ex.stream:
            return await _open_stream(svc, plan, turn, ex, key)
        result = await attempt(svc, plan, ex, lambda p, t, s: p.chat(chat, t, s))
        ex.usage = result.usage
        if result.usage.input_tokens is None or result.usage.output_tokens is None:
            ex.usage = estimate(chat, result.body, ex, result.usage)
        if key is not None and caching.cacheable(result.body):
            caching.store(svc, plan, ex, key, orjson.dumps(result.body))
        response = from_chat(turn.body, result.body, turn.rid, turn.created_at, ex.usage)
        await _save(svc, turn, response, ex)
    record(svc, ex)
    return await durable(ex, Reply(_headers(ex, turn), body=orjson.dumps(response)))


async def _replay(svc: Services, hit: bytes, turn: _Turn, ex: Exchange, status: str) -> Reply:
    """A cached chat answer as a Response (or its events); metered at cost 0 by caching.replay."""
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
Opened = tuple[ChatStream, AsyncIterator[dict[str, Any]], dict[str, Any]]


async def _open_stream(svc: Services, plan: RoutePlan, turn: _Turn, ex: Exchange, key: str | None) -> Reply:
    idle = plan.policy.stream_idle_timeout_s

    async def open_one(provider: Provider, target: Target, timeout: float) -> Opened:
        stream = await provider.chat_stream(turn.chat, target, timeout, idle)
        iterator = aiter(stream)
        try:
            async with asyncio.timeout(timeout):
                first = await anext(iterator)
        except StopAsyncIteration:
            await stream.aclose()
            raise UpstreamError(f"upstream '{target.provider}' sent an empty stream") from None
        except BaseException:
            await stream.aclose()
            raise
        return stream, iterator, first

    opened = await attempt(svc, plan, ex, open_one)
    stream = opened[0]

    async def on_close() -> None:
        if ex.ttft is None and not ex.recorded:  # the client left before the first byte
            ex.status, ex.http_status = "client_disconnected", 499
            ex.usage = stream.usage or estimate(turn.chat, None, ex, None)
            record(svc, ex)
            await stream.aclose()

    return Reply(_headers(ex, turn), stream=_relay(svc, plan, opened, turn, ex, key), on_close=on_close)


async def _relay(
    svc: Services, plan: RoutePlan, opened: Opened, turn: _Turn, ex: Exchange, key: str | None
) -> AsyncIterator[bytes]:
    stream, iterator, first = opened
    encoder = EventEncoder(turn.skeleton())
    assembler = StreamAssembler()
    deadline_s = plan.policy.deadline_s
    deadline = ex.started + deadline_s
    ex.status = "client_disconnected"  # until proven otherwise
    try:
        ex.ttft = time.perf_counter() - ex.started
        for event in encoder.start():
            yield frame(event)
        assembler.add(first)
        for event in encoder.add(first):
            yield frame(event)
        relayed = 0
        async for chunk in iterator:
            assembler.add(chunk)
            relayed += 1
            if relayed % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the disconnect watcher notice a client gone
            if time.perf_counter() > deadline:
                raise UpstreamTimeoutError(f"deadline of {deadline_s:g}s for '{plan.name}' exceeded")
            for event in encoder.add(chunk):
                yield frame(event)
        completion = assembler.completion()
        ex.status = "ok"
        ex.usage = stream.usage or estimate(turn.chat, completion, ex, None)
        events = list(encoder.finish(ex.usage))
        await _save(svc, turn, encoder.response, ex)
        record(svc, ex)
        await durable(ex, None)  # the ledger row is committed before response.completed
        if key is not None and caching.cacheable(completion):
            caching.store(svc, plan, ex, key, orjson.dumps(completion))
        for event in events:
            yield frame(event)
    except (UpstreamError, StreamBrokenError) as exc:
        ex.status, ex.http_status, ex.error_code = "stream_broken", 502, exc.code
        exc.message = redact(exc.message, svc.secrets)
        yield frame(encoder.error(exc))
    except Exception as exc:  # a bug: the stream ends with an error event, never a clean end
        log.error("unexpected error relaying request %s", ex.request_id, exc_info=exc)
        error = InternalError(f"Internal gateway error (request id {ex.request_id})")
        ex.status, ex.http_status, ex.error_code = "stream_broken", error.status, error.code
        yield frame(encoder.error(error))
    finally:
        if not ex.recorded:  # broken or abandoned (an ok stream recorded above)
            ex.usage = stream.usage or estimate(turn.chat, assembler.completion(), ex, None)
            if ex.status == "client_disconnected":
                ex.http_status = 499
            record(svc, ex)
        await stream.aclose()


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
