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

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.core.errors import (
    BadRequestError,
    InternalError,
    StreamBrokenError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.core.ports import MessagesStream, MessagesUpstream, Provider
from gateway.core.redact import redact
from gateway.core.types import ChatStream, RawResult, Target, Usage, usage_from_anthropic
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.pipeline import admit, guarded, reserve
from gateway.flow.reply import Reply, headers
from gateway.flow.services import Services
from gateway.flow.stream import YIELD_EVERY
from gateway.flow.upstream import attempt, metered
from gateway.ledger.meter import estimate_usage
from gateway.ledger.tokens import count_prompt_tokens
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


def _native(svc: Services, target: Target) -> bool:
    provider = svc.policy.providers.get(target.provider)
    return provider is not None and provider.type == "anthropic" and not provider.replicas


async def messages(svc: Services, body: dict[str, Any], forwarded: Mapping[str, str], ex: Exchange) -> Reply:
    ex.endpoint, ex.requested, ex.stream = "messages", str(body["model"]), bool(body.get("stream"))
    req = _Request(body, forwarded)
    async with guarded(svc, ex):
        if cache_breakpoints(body) > MAX_BREAKPOINTS:
            raise BadRequestError(f"A request may carry at most {MAX_BREAKPOINTS} cache_control breakpoints")
        plan = await admit(svc, body["model"], ex, "chat")
        ex.conversation = conversation_key(ex.principal.tenant, plan.name, body)
        key = _cache_key(svc, plan, req, ex)
        if key is not None and ex.cache == "miss":
            hit = await svc.cache.get(key)
            svc.metrics.cache.labels("hit" if hit is not None else "miss").inc()
            if hit is not None:
                return await durable(ex, _replay(svc, hit, req, ex))
        plan = await reserve(svc, plan, body, ex)
        if ex.stream:
            return await _open_stream(svc, plan, req, ex)
        result = await attempt(svc, plan, ex, lambda p, t, s: _call(svc, req, p, t, s))
        ex.usage = metered(svc, req.counted, None, ex, result.usage)
        payload = orjson.dumps(result.body)
        if key is not None and result.body.get("stop_reason") in _CACHEABLE_STOPS:
            ttl = plan.policy.cache.ttl_s or svc.policy.cache.ttl_s
            svc.tasks.spawn(svc.cache.set(key, payload, ttl))
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


def _replay(svc: Services, hit: bytes, req: _Request, ex: Exchange) -> Reply:
    ex.cache = "hit"
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
Opened = tuple[MessagesStream | ChatStream, AsyncIterator[Any], Any, bool]


async def _open_stream(svc: Services, plan: RoutePlan, req: _Request, ex: Exchange) -> Reply:
    idle = plan.policy.stream_idle_timeout_s

    async def open_one(provider: Provider, target: Target, timeout: float) -> Opened:
        native = _native(svc, target)
        stream: MessagesStream | ChatStream
        if native:
            upstream = cast(MessagesUpstream, provider)
            stream = await upstream.messages_stream(req.body, target, timeout, idle, req.forwarded)
        else:
            stream = await provider.chat_stream(req.chat(), target, timeout, idle)
        iterator = aiter(stream)
        try:
            first = await anext(iterator)
        except StopAsyncIteration:
            await stream.aclose()
            raise UpstreamError(f"upstream '{target.provider}' sent an empty stream") from None
        except BaseException:
            await stream.aclose()
            raise
        return stream, iterator, first, native

    opened = await attempt(svc, plan, ex, open_one)
    stream = opened[0]

    async def on_close() -> None:
        if ex.ttft is None and not ex.recorded:  # the client left before the first byte
            ex.status, ex.http_status = "client_disconnected", 499
            ex.usage = stream.usage or estimate_usage(req.counted, None, _model(ex, req.body), None)
            record(svc, ex)
            await stream.aclose()

    return Reply(_headers(ex, req), stream=_relay(svc, plan, opened, req, ex), on_close=on_close)


async def _relay(
    svc: Services, plan: RoutePlan, opened: Opened, req: _Request, ex: Exchange
) -> AsyncIterator[bytes]:
    stream, iterator, first, native = opened
    encoder = None if native else ChunkEncoder(str(req.body["model"]))
    deadline_s = plan.policy.deadline_s
    deadline = ex.started + deadline_s
    ex.status = "client_disconnected"  # until proven otherwise
    try:
        ex.ttft = time.perf_counter() - ex.started
        items = _native_frames(first, iterator) if native else _translated_frames(first, iterator, encoder)
        relayed = 0
        async for out in items:
            relayed += 1
            if relayed % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the disconnect watcher cancel a fast relay
            if time.perf_counter() > deadline:
                raise UpstreamTimeoutError(f"deadline of {deadline_s:g}s for '{plan.name}' exceeded")
            if out is None:  # the end is next: the ledger row first
                ex.status = "ok"
                ex.usage = metered(svc, req.counted, None, ex, stream.usage)
                record(svc, ex)
                await durable(ex, None)
                if encoder is not None:
                    for frame_ in encoder.finish(ex.usage):
                        yield frame_
                continue
            yield out
    except (UpstreamError, StreamBrokenError) as exc:
        ex.status, ex.http_status, ex.error_code = "stream_broken", 502, exc.code
        exc.message = redact(exc.message, svc.secrets)
        yield frame("error", error_body(exc))
    except Exception as exc:  # a bug: the stream ends with an error event, never a clean end
        log.error("unexpected error relaying request %s", ex.request_id, exc_info=exc)
        error = InternalError(f"Internal gateway error (request id {ex.request_id})")
        ex.status, ex.http_status, ex.error_code = "stream_broken", error.status, error.code
        yield frame("error", error_body(error))
    finally:
        if not ex.recorded:  # broken or abandoned (an ok stream recorded above)
            ex.usage = metered(svc, req.counted, None, ex, stream.usage)
            if ex.status == "client_disconnected":
                ex.http_status = 499
            record(svc, ex)
        await stream.aclose()


async def _translated_frames(
    first: Any, iterator: AsyncIterator[Any], encoder: ChunkEncoder | None
) -> AsyncIterator[bytes | None]:
    """Chat chunks as Anthropic frames; None at the end (the caller commits the row, then
    sends the encoder's closing events)."""
    assert encoder is not None
    for out in encoder.add(first):
        yield out
    async for chunk in iterator:
        for out in encoder.add(chunk):
            yield out
    yield None


async def _native_frames(first: Any, iterator: AsyncIterator[Any]) -> AsyncIterator[bytes | None]:
    """The upstream's events re-framed with their data bytes untouched; None just before
    ``message_stop`` (the caller commits the ledger row there)."""
    event, raw, _ = first
    yield frame(event, raw)
    async for event, raw, data in iterator:
        if data.get("type") == "message_stop":
            yield None
        yield frame(event, raw)


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
