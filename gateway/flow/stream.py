"""A streamed chat answer: open the upstream stream (retries and fallbacks apply until its
first chunk), relay the chunks, and meter the request however the stream ends — clean
(ledger row committed before ``[DONE]``), cut by the upstream (an error event, never a clean
end), or abandoned by the client (499, the upstream released)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.cache.replay import StreamAssembler
from gateway.core.errors import InternalError, StreamBrokenError, UpstreamError, UpstreamTimeoutError
from gateway.core.ports import Provider
from gateway.core.redact import redact
from gateway.core.types import ChatRequest, ChatStream, Target
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


async def open_chat_stream(
    svc: Services, plan: RoutePlan, body: dict[str, Any], req: ChatRequest, ex: Exchange, key: str | None
) -> Reply:
    idle = plan.policy.stream_idle_timeout_s

    async def open_stream(provider: Provider, target: Target, timeout: float) -> Opened:
        stream = await provider.chat_stream(body, target, timeout, idle)
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

    opened = await attempt(svc, plan, ex, open_stream)
    stream = opened[0]

    async def on_close() -> None:
        if ex.ttft is None and not ex.recorded:  # the client left before the first byte
            ex.status, ex.http_status = "client_disconnected", 499
            ex.usage = metered(svc, req.body, None, ex, stream.usage)
            record(svc, ex)
            await stream.aclose()

    return Reply(headers(ex), stream=relay(svc, plan, opened, req, ex, key), on_close=on_close)


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
