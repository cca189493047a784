"""Anthropic Messages requests (``POST /v1/messages``): the same steps as chat (plan, limits,
exact cache, budget reservation, attempts, metering), with two ways to each target:

- an Anthropic upstream gets the client's body as it is (only ``model`` replaced: thinking
  blocks and signatures, ``cache_control`` breakpoints, beta features and unknown fields
  untouched) and its answer or event stream comes back as it is;
- any other upstream gets the request translated to chat (protocols/anthropic_messages.py)
  and its answer translated back, streams included.

The client always gets Anthropic's shapes; the ledger row is committed before the end
(``message_stop``) goes out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.cache.replay import StreamAssembler
from gateway.core.errors import BadRequestError
from gateway.core.ports import MessagesStream, MessagesUpstream, Provider
from gateway.core.types import ChatStream, RawResult, Target, Usage, usage_from_anthropic
from gateway.flow import caching
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.pipeline import admit, guarded, reserve
from gateway.flow.reply import Reply, headers
from gateway.flow.services import Services
from gateway.flow.stream import END, Encoded, Frames, on_close, open_first, relay_frames
from gateway.flow.upstream import attempt, metered
from gateway.ledger.meter import estimate_usage
from gateway.ledger.tokens import count_prompt_tokens
from gateway.protocols.anthropic_assemble import MessageAssembler
from gateway.protocols.anthropic_events import ChunkEncoder, frame, message_frames
from gateway.protocols.anthropic_messages import cache_breakpoints, error_body, from_chat, to_chat
from gateway.routing.plan import RoutePlan
from gateway.routing.sticky import conversation_key

log = logging.getLogger("switchyard")
MAX_BREAKPOINTS = 4  # Anthropic's limit of cache_control markers per request
_CACHEABLE_STOPS = ("end_turn", "tool_use", "max_tokens", "stop_sequence")


class _Request:
    """One Messages request and its chat translation (made once, when a chat target needs it)."""

    def __init__(self, body: dict[str, Any], forwarded: Mapping[str, str]) -> None:
        self.body = body
        self.forwarded = forwarded
        self._chat: dict[str, Any] | None = None
        self.dropped: list[str] = []

    @property
    def counted(self) -> dict[str, Any]:
        """What a local token count should read: the chat translation once made, else the body."""
        return self._chat if self._chat is not None else self.body

    def chat(self) -> dict[str, Any]:
        if self._chat is None:
            self._chat, self.dropped = to_chat(self.body)
        return self._chat


def _native(svc: Services, target: Target | None) -> bool:
    provider = svc.policy.providers.get(target.provider) if target is not None else None
    return provider is not None and provider.type == "anthropic" and not provider.replicas


async def messages(svc: Services, body: dict[str, Any], forwarded: Mapping[str, str], ex: Exchange) -> Reply:
    ex.endpoint, ex.requested, ex.stream = "messages", str(body["model"]), bool(body.get("stream"))
    req = _Request(body, forwarded)
    async with guarded(svc, ex):
        if cache_breakpoints(body) > MAX_BREAKPOINTS:
            raise BadRequestError(f"A request may carry at most {MAX_BREAKPOINTS} cache_control breakpoints")
        # the reservation is taken in the admission's round trip (Redis), on the body as sent
        plan = await admit(svc, body["model"], ex, "chat", body, with_params=False)
        ex.conversation = conversation_key(ex.principal.tenant, plan.name, body)
        key = _cache_key(svc, plan, req, ex)
        if key is not None and ex.cache == "miss":
            hit = await svc.cache.get(key)
            svc.metrics.cache.labels("hit" if hit is not None else "miss").inc()
            if hit is not None:
                return await durable(ex, _replay(svc, hit, req, ex, "hit"))
            sem = await caching.semantic_get(svc, plan, body, ex, protocol="messages")
            if sem is not None and sem.lookup.payload is not None:
                return await durable(ex, _replay(svc, sem.lookup.payload, req, ex, "semantic_hit"))
        plan = await reserve(svc, plan, body, ex)
        if ex.stream:
            return await _open_stream(svc, plan, req, ex, key)
        result = await attempt(svc, plan, ex, lambda p, t, s: _call(svc, req, p, t, s))
        ex.usage = metered(svc, req.counted, None, ex, result.usage)
        payload = orjson.dumps(result.body)
        if key is not None and result.body.get("stop_reason") in _CACHEABLE_STOPS:
            caching.store(svc, plan, ex, key, payload)
    record(svc, ex)
    return await durable(ex, Reply(_headers(ex, req), body=payload))


async def _call(
    svc: Services, req: _Request, provider: Provider, target: Target, timeout: float
) -> RawResult:
    if _native(svc, target):
        upstream = cast(MessagesUpstream, provider)
        return await upstream.messages(req.body, target, timeout, req.forwarded)
    result = await provider.chat(req.chat(), target, timeout)
    return RawResult(from_chat(result.body, str(req.body["model"]), result.usage), result.usage)


def _model(ex: Exchange, body: dict[str, Any]) -> str:
    return ex.target.upstream_model if ex.target is not None else str(body.get("model") or "")


def _headers(ex: Exchange, req: _Request) -> dict[str, str]:
    out = headers(ex)
    if req.dropped:
        out["x-switchyard-dropped"] = ",".join(req.dropped)
    return out


def _cache_key(svc: Services, plan: RoutePlan, req: _Request, ex: Exchange) -> str | None:
    mode = plan.policy.cache.mode
    if mode == "off" or (mode == "deterministic" and not is_deterministic(req.body)):
        ex.cache = "off"
        return None
    keyed = {**req.body, "anthropic-beta": req.forwarded.get("anthropic-beta")}
    key = canonical_key(ex.principal.tenant, plan.name, "messages", keyed)
    if ex.no_cache:
        ex.cache = "bypass"
        return key
    ex.cache = "miss"
    return key


def _replay(svc: Services, hit: bytes, req: _Request, ex: Exchange, status: str) -> Reply:
    """A cached Messages answer (exact or semantic hit), as JSON or as its events; cost 0."""
    ex.cache = status
    hit = caching.unwrap(hit, ex)
    message = orjson.loads(hit)
    ex.usage = usage_from_anthropic(message.get("usage")) or Usage()
    ex.target = None
    record(svc, ex)
    if not ex.stream:
        return Reply(_headers(ex, req), body=hit)
    frames = message_frames(message)

    async def replay() -> AsyncIterator[bytes]:
        for f in frames:
            yield f

    return Reply(_headers(ex, req), stream=replay())


# --------------------------------------------------------------------------- streams
async def _open_stream(svc: Services, plan: RoutePlan, req: _Request, ex: Exchange, key: str | None) -> Reply:
    async def open_stream(
        provider: Provider, target: Target, timeout: float, idle: float
    ) -> MessagesStream | ChatStream:
        if _native(svc, target):
            upstream = cast(MessagesUpstream, provider)
            return await upstream.messages_stream(req.body, target, timeout, idle, req.forwarded)
        return await provider.chat_stream(req.chat(), target, timeout, idle)

    stream, iterator, first = await open_first(svc, plan, ex, open_stream)
    close = on_close(
        svc, ex, stream, lambda: stream.usage or estimate_usage(req.counted, None, _model(ex, req.body), None)
    )
    native = _native(svc, ex.target)
    if native:
        frames, answer = _native_frames(first, iterator)
        encoder = None
    else:
        encoder = ChunkEncoder(str(req.body["model"]))
        frames, answer = _translated_frames(first, iterator, encoder, req)

    async def finish() -> list[bytes]:
        ex.usage = metered(svc, req.counted, None, ex, stream.usage)
        record(svc, ex)
        await durable(ex, None)  # the ledger row is committed before message_stop goes out
        closing = encoder.finish(ex.usage) if encoder is not None else []
        message = answer(ex.usage)
        if key is not None and message is not None and message.get("stop_reason") in _CACHEABLE_STOPS:
            caching.store(svc, plan, ex, key, orjson.dumps(message))
        return closing

    encoded = Encoded(
        frames,
        finish,
        error=lambda exc: frame("error", error_body(exc)),
        usage=lambda: metered(svc, req.counted, None, ex, stream.usage),
    )
    return Reply(_headers(ex, req), stream=relay_frames(svc, plan, ex, stream, encoded), on_close=close)


Answer = Callable[[Usage], dict[str, Any] | None]


def _translated_frames(
    first: dict[str, Any], iterator: AsyncIterator[dict[str, Any]], encoder: ChunkEncoder, req: _Request
) -> tuple[Frames, Answer]:
    """Chat chunks as Anthropic frames; END at the end (the caller commits the row, then sends
    the encoder's closing events); the answer, for the cache: the chunks as a message."""
    assembler = StreamAssembler()

    async def frames() -> Frames:
        assembler.add(first)
        for out in encoder.add(first):
            yield out
        async for chunk in iterator:
            assembler.add(chunk)
            for out in encoder.add(chunk):
                yield out
        yield END

    def answer(usage: Usage) -> dict[str, Any] | None:
        return from_chat(assembler.completion(), str(req.body["model"]), usage)

    return frames(), answer


def _native_frames(
    first: tuple[str, bytes, dict[str, Any]], iterator: AsyncIterator[tuple[str, bytes, dict[str, Any]]]
) -> tuple[Frames, Answer]:
    """The upstream's events re-framed with their data bytes untouched; END just before
    ``message_stop`` (the caller commits the ledger row there); the answer, for the cache:
    the events put back together."""
    assembler = MessageAssembler()

    async def frames() -> Frames:
        event, raw, data = first
        assembler.add(data)
        yield frame(event, raw)
        async for event, raw, data in iterator:
            if data.get("type") == "message_stop":
                yield END
            assembler.add(data)
            yield frame(event, raw)

    return frames(), lambda _usage: assembler.result()


# --------------------------------------------------------------------------- count_tokens
async def count_tokens(svc: Services, body: dict[str, Any], ex: Exchange) -> dict[str, int]:
    """``POST /v1/messages/count_tokens``: the route must exist for the caller; the count is
    the gateway's tokenizer estimate over the request as a chat upstream would get it."""
    plan = svc.router.plan(body["model"], ex.principal, "chat")
    model = plan.targets[0].upstream_model if plan.targets else str(body["model"])
    try:
        chat, _ = to_chat({**body, "max_tokens": 1})
    except BadRequestError:  # blocks a chat upstream cannot take (documents...): about 4 bytes a token
        return {"input_tokens": len(orjson.dumps(body)) // 4}
    return {"input_tokens": count_prompt_tokens(chat, model)}
