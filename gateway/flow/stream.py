"""Streamed answers, every protocol: open the upstream stream (retries and fallbacks apply
until its first item), relay it as the request's protocol's frames (its adapter's encoder),
and meter the request however the stream ends — clean (ledger row committed before the end:
``[DONE]``, ``message_stop``, ``response.completed``), cut by the upstream (an error event,
never a clean end), or abandoned by the client (499, the upstream released)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gateway.core.errors import (
    InternalError,
    StreamBrokenError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.core.ports import Provider
from gateway.core.redact import redact
from gateway.core.types import Target, Usage
from gateway.flow import caching
from gateway.flow.adapters.base import Encoder, Inbound, Upstream
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.reply import Reply
from gateway.flow.services import Services
from gateway.flow.upstream import attempt, metered
from gateway.routing.plan import RoutePlan
from gateway.telemetry.prompt_log import log_exchange

log = logging.getLogger("switchyard")
YIELD_EVERY = 16  # chunks relayed between two forced suspensions of the relaying task


class Closable(Protocol):
    async def aclose(self) -> None: ...


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


async def open_stream(
    svc: Services, plan: RoutePlan, inbound: Inbound, ex: Exchange, key: str | None
) -> Reply:
    """Open the upstream stream (retries and fallbacks until its first item) and hand the
    client its frames in the request's protocol (the adapter's encoder)."""
    stream, iterator, first = await open_first(svc, plan, ex, inbound.open)
    body = inbound.record.body
    close = on_close(svc, ex, stream, lambda: metered(svc, body, None, ex, stream.usage))
    encoder = inbound.encoder(stream, ex)
    relayed = relay(svc, plan, ex, (stream, iterator, first), encoder, inbound, key)
    return Reply(inbound.headers(ex), stream=relayed, on_close=close)


async def relay(
    svc: Services,
    plan: RoutePlan,
    ex: Exchange,
    opened: Opened_[Upstream],
    encoder: Encoder,
    inbound: Inbound,
    key: str | None,
) -> AsyncIterator[bytes]:
    """Relay the upstream's items as the encoder's frames. The request is ok once the
    upstream ended cleanly (or sent its terminal item): it is metered, its row committed,
    then the closing frames go out. A cut or an upstream error ends with the encoder's error
    frame, a bug with an internal error's, never a clean end; a client that left is a 499."""
    stream, iterator, first = opened
    body = inbound.record.body
    clock = Deadline(ex.started + plan.policy.deadline_s)
    ex.status = "client_disconnected"  # until proven otherwise
    try:
        ex.ttft = time.perf_counter() - ex.started
        out = encoder.first(first)
        if out:
            yield out
        relayed = 0
        done = False
        while True:
            if clock.expired:
                raise _past_deadline(plan)
            clock.waiting = True
            try:
                item = await anext(iterator)
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                if clock.cut():
                    raise _past_deadline(plan) from None
                raise
            finally:
                clock.waiting = False
            relayed += 1
            if relayed % YIELD_EVERY == 0:
                # A fast upstream and a client that left never suspend this task (a send to a
                # closed connection returns at once): give the disconnect watcher its turn.
                await asyncio.sleep(0)
            if not done and encoder.last(item):
                done = True
                closing = await _finish(svc, plan, ex, stream, encoder, body, key)
                if closing:
                    yield closing
            out = encoder.add(item)
            if out:
                yield out
        if not done:
            yield await _finish(svc, plan, ex, stream, encoder, body, key)
    except (UpstreamError, StreamBrokenError) as exc:
        ex.status, ex.http_status, ex.error_code = "stream_broken", 502, exc.code
        exc.message = redact(exc.message, svc.secrets)
        yield encoder.error(exc)
    except Exception as exc:  # a bug: the stream ends with an error event, never a clean end
        log.error("unexpected error relaying request %s", ex.request_id, exc_info=exc)
        error = InternalError(f"Internal gateway error (request id {ex.request_id})")
        ex.status, ex.http_status, ex.error_code = "stream_broken", error.status, error.code
        yield encoder.error(error)
    finally:
        clock.cancel()
        if not ex.recorded:  # broken or abandoned (an ok stream was recorded at its end)
            ex.usage = metered(svc, body, encoder.completion(), ex, stream.usage)
            if ex.status == "client_disconnected":
                ex.http_status = 499
            record(svc, ex)
        await stream.aclose()


class Deadline:
    """A stream's deadline: one timer for the whole stream (not one per item). Past it, a
    wait for the next upstream item is cut (even a stalled upstream that keeps its
    connection open) and the next wait fails at once; a relay busy sending is not cut."""

    __slots__ = ("expired", "handle", "task", "waiting")

    def __init__(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.expired = False
        self.waiting = False
        self.handle = loop.call_later(max(0.0, deadline - time.perf_counter()), self._fire)

    def _fire(self) -> None:
        self.expired = True
        if self.waiting and self.task is not None:
            self.task.cancel()

    def cut(self) -> bool:
        """The wait was cancelled by the deadline (not by anything else): True, and the
        cancellation is taken back."""
        return self.expired and self.task is not None and self.task.uncancel() == 0

    def cancel(self) -> None:
        self.handle.cancel()


def _past_deadline(plan: RoutePlan) -> UpstreamTimeoutError:
    return UpstreamTimeoutError(f"deadline of {plan.policy.deadline_s:g}s for '{plan.name}' exceeded")


async def _finish(
    svc: Services,
    plan: RoutePlan,
    ex: Exchange,
    stream: Upstream,
    encoder: Encoder,
    body: dict[str, Any],
    key: str | None,
) -> bytes:
    """A stream that ended well: meter it, let the encoder close (and keep what its protocol
    keeps), commit the row, store the answer; the closing frames to send after."""
    ex.status = "ok"
    completion = encoder.completion()
    ex.usage = metered(svc, body, completion, ex, stream.usage)
    closing = await encoder.finish(ex)
    log_exchange(svc.policy, ex.request_id, ex.principal.tenant, body, completion)
    record(svc, ex)
    await durable(ex, None)  # the ledger row is committed before the end goes out
    if key is not None and ex.status == "ok":
        cached = encoder.cached(ex.usage)
        if cached is not None:
            caching.store(svc, plan, ex, key, cached)
    return closing
