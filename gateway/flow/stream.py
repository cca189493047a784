"""Streamed answers: open the upstream stream (retries and fallbacks apply until its first
chunk), relay it, and meter the request however the stream ends — clean (ledger row
committed before the end: ``[DONE]``, ``message_stop``, ``response.completed``), cut by the
upstream (an error event, never a clean end), or abandoned by the client (499, the upstream
released).

``open_first`` and ``on_close`` serve every protocol; ``relay_frames`` is the one relay loop of
the Messages and Responses flows, which hand it their encoder's frames (``END`` marks the
point where the row is committed and the closing frames go out). The chat stream keeps its
own loop (``relay``): the same steps, inlined, because it is the hot path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from gateway.cache.replay import StreamAssembler
from gateway.core.errors import (
    InternalError,
    StreamBrokenError,
    SwitchyardError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.core.ports import Provider
from gateway.core.redact import redact
from gateway.core.types import ChatRequest, ChatStream, Target, Usage
from gateway.flow import caching
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.reply import DONE, Reply, headers, sse
from gateway.flow.services import Services
from gateway.flow.upstream import attempt, metered
from gateway.routing.plan import RoutePlan
from gateway.telemetry.prompt_log import log_exchange

log = logging.getLogger("switchyard")
YIELD_EVERY = 16  # chunks relayed between two forced suspensions of the relaying task
Opened = tuple[ChatStream, AsyncIterator[dict[str, Any]], dict[str, Any]]


class Closable(Protocol):
    async def aclose(self) -> None: ...


class Upstream(Closable, Protocol):
    """An accepted upstream stream of any protocol (ChatStream, MessagesStream, ResponsesStream)."""

    def __aiter__(self) -> AsyncIterator[Any]: ...


_S = TypeVar("_S", bound=Upstream)
Opened_ = tuple[_S, AsyncIterator[Any], Any]
Opener = Callable[[Provider, Target, float, float], Awaitable[_S]]


async def open_first(svc: Services, plan: RoutePlan, ex: Exchange, open_stream: Opener[_S]) -> Opened_[_S]:
    """Open a stream on the plan's targets (retries and fallbacks until its first item
    arrived): (the stream, its iterator, the first item). ``open_stream(provider, target,
    timeout, idle_timeout)`` opens one."""
    idle = plan.policy.stream_idle_timeout_s

    async def open_one(provider: Provider, target: Target, timeout: float) -> Opened_[_S]:
        stream = await open_stream(provider, target, timeout, idle)
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

    return await attempt(svc, plan, ex, open_one)


def on_close(
    svc: Services, ex: Exchange, stream: Closable, usage: Callable[[], Usage]
) -> Callable[[], Awaitable[None]]:
    """What the API layer awaits once the response is over: a client that left before the
    first byte leaves a 499 row (``usage()`` meters it) and the upstream released."""

    async def close() -> None:
        if ex.ttft is None and not ex.recorded:  # the client left before the first byte
            ex.status, ex.http_status = "client_disconnected", 499
            ex.usage = usage()
            record(svc, ex)
            await stream.aclose()

    return close


async def open_chat_stream(
    svc: Services, plan: RoutePlan, body: dict[str, Any], req: ChatRequest, ex: Exchange, key: str | None
) -> Reply:
    async def open_stream(provider: Provider, target: Target, timeout: float, idle: float) -> ChatStream:
        return await provider.chat_stream(body, target, timeout, idle)

    opened = await open_first(svc, plan, ex, open_stream)
    stream = opened[0]
    close = on_close(svc, ex, stream, lambda: metered(svc, req.body, None, ex, stream.usage))
    return Reply(headers(ex), stream=relay(svc, plan, opened, req, ex, key), on_close=close)


END = None  # in an encoder's frames: the row is committed, the closing frames go out next
Frames = AsyncGenerator[bytes | None, None]


@dataclass(frozen=True, slots=True)
class Encoded:
    """An upstream stream in the client's protocol, as relay_frames takes it."""

    frames: Frames  # the client's frames, END where the request is done
    finish: Callable[[], Awaitable[Iterable[bytes]]]  # at END: meter, commit the row -> closing frames
    error: Callable[[SwitchyardError], bytes]  # the frame of an error that ends the stream
    usage: Callable[[], Usage]  # what a stream that did not finish is metered with


async def relay_frames(
    svc: Services, plan: RoutePlan, ex: Exchange, stream: Closable, encoded: Encoded
) -> AsyncIterator[bytes]:
    """Relay an encoder's frames to the client. At ``END`` the request is ok: ``finish()``
    meters it, commits its row and returns the closing frames (frames after ``END`` still go
    out). A cut or an upstream error becomes ``error(exc)``'s frame, a bug an internal error's
    frame; a request that did not finish is metered with ``usage()`` (499 when the client left)."""
    frames, finish, error, usage = encoded.frames, encoded.finish, encoded.error, encoded.usage
    deadline_s = plan.policy.deadline_s
    deadline = ex.started + deadline_s
    ex.status = "client_disconnected"  # until proven otherwise
    try:
        ex.ttft = time.perf_counter() - ex.started
        relayed = 0
        async for out in frames:
            relayed += 1
            if relayed % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the disconnect watcher cancel a fast relay
            if time.perf_counter() > deadline:
                raise UpstreamTimeoutError(f"deadline of {deadline_s:g}s for '{plan.name}' exceeded")
            if out is END:
                ex.status = "ok"
                for closing in await finish():
                    yield closing
                continue
            yield out
    except (UpstreamError, StreamBrokenError) as exc:
        ex.status, ex.http_status, ex.error_code = "stream_broken", 502, exc.code
        exc.message = redact(exc.message, svc.secrets)
        yield error(exc)
    except Exception as exc:  # a bug: the stream ends with an error event, never a clean end
        log.error("unexpected error relaying request %s", ex.request_id, exc_info=exc)
        internal = InternalError(f"Internal gateway error (request id {ex.request_id})")
        ex.status, ex.http_status, ex.error_code = "stream_broken", internal.status, internal.code
        yield error(internal)
    finally:
        if not ex.recorded:  # broken or abandoned (an ok stream recorded at END)
            ex.usage = usage()
            if ex.status == "client_disconnected":
                ex.http_status = 499
            record(svc, ex)
        await frames.aclose()
        await stream.aclose()


async def relay(
    svc: Services, plan: RoutePlan, opened: Opened, req: ChatRequest, ex: Exchange, key: str | None
) -> AsyncIterator[bytes]:
    stream, iterator, first = opened
    assembler = StreamAssembler()
    include_usage = req.include_usage
    deadline_s = plan.policy.deadline_s
    deadline = ex.started + deadline_s
    ex.status = "client_disconnected"  # until proven otherwise
    try:
        assembler.add(first)
        ex.ttft = time.perf_counter() - ex.started
        yield sse(first)
        relayed = 0
        async for chunk in iterator:
            assembler.add(chunk)
            relayed += 1
            if relayed % YIELD_EVERY == 0:
                # A fast upstream and a client that left never suspend this task (a send to a
                # closed connection returns at once): give the disconnect watcher its turn.
                await asyncio.sleep(0)
            if time.perf_counter() > deadline:
                raise UpstreamTimeoutError(f"deadline of {deadline_s:g}s for '{plan.name}' exceeded")
            if not include_usage and not chunk.get("choices") and chunk.get("usage"):
                continue  # the usage-only chunk the client did not ask for
            yield sse(chunk)
        ex.status = "ok"
        completion = assembler.completion()
        log_exchange(svc.policy, ex.request_id, ex.principal.tenant, req.body, completion)
        ex.usage = metered(svc, req.body, completion, ex, stream.usage)
        record(svc, ex)
        await durable(ex, None)  # the ledger row is committed before [DONE] goes out
        if key is not None:
            caching.store(svc, plan, ex, key, orjson.dumps(completion))
        yield DONE
    except (UpstreamError, StreamBrokenError) as exc:
        ex.status, ex.http_status, ex.error_code = "stream_broken", 502, exc.code
        exc.message = redact(exc.message, svc.secrets)
        yield sse(exc.to_body())
    except Exception as exc:  # a bug: the stream ends with an error event, never a clean end
        log.error("unexpected error relaying request %s", ex.request_id, exc_info=exc)
        error = InternalError(f"Internal gateway error (request id {ex.request_id})")
        ex.status, ex.http_status, ex.error_code = "stream_broken", error.status, error.code
        yield sse(error.to_body())
    finally:
        if not ex.recorded:  # broken or abandoned (an ok stream recorded above)
            ex.usage = metered(svc, req.body, assembler.completion(), ex, stream.usage)
            if ex.status == "client_disconnected":
                ex.http_status = 499
            record(svc, ex)
        await stream.aclose()
