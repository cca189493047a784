"""The one orchestrator of a request: limits -> exact cache -> route -> provider (retries,
fallbacks, breakers) -> meter -> ledger, cache, metrics. Handlers call it; it knows no HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.cache.replay import StreamAssembler, completion_chars, completion_to_chunks
from gateway.core.errors import StreamBrokenError, SwitchyardError, UpstreamError
from gateway.core.redact import redact
from gateway.core.types import ChatRequest, ChatStream, RawResult, RequestContext, Target, Usage
from gateway.core.types import usage_from_openai as read_usage
from gateway.ledger.pricing import cost_of
from gateway.ledger.row import LedgerRow
from gateway.ledger.store import SQLiteLedger
from gateway.limits.ratelimit import RpmLimiter
from gateway.routing.attempts import run_with_fallback
from gateway.routing.breaker import BreakerBoard
from gateway.routing.params import apply_params
from gateway.routing.router import RoutePlan
from gateway.runtime import Runtime
from gateway.telemetry.metrics import Metrics

DONE = b"data: [DONE]\n\n"
ZERO = Decimal("0E-10")


@dataclass(slots=True)
class Reply:
    """What the API layer renders: a JSON body or an SSE byte stream, plus headers."""

    headers: dict[str, str]
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    status: int = 200
    # For streams: the API layer awaits this once the response is over, however it ended. It
    # releases the upstream and records the request if the stream was never iterated (the
    # client left before the first byte).
    on_close: Callable[[], Awaitable[None]] | None = None


@dataclass(slots=True)
class _Outcome:
    """Facts collected for the ledger row and the metrics of one request."""

    endpoint: str
    requested: str
    plan: RoutePlan | None = None
    target: Target | None = None
    usage: Usage = field(default_factory=Usage)
    cache: str = "off"
    status: str = "ok"
    http_status: int = 200
    error_code: str | None = None
    ttft: float | None = None
    stream: bool = False


def estimate_tokens(chars: int) -> int:
    """Rough token count (4 characters a token) for when an upstream reports no usage."""
    return max(1, (chars + 3) // 4)


def _prompt_chars(body: dict[str, Any]) -> int:
    return len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("input") or ""))


def _estimate(body: dict[str, Any], output_chars: int) -> Usage:
    """Usage counted locally (marked estimated) for an upstream that reported none."""
    return Usage(
        input_tokens=estimate_tokens(_prompt_chars(body)),
        output_tokens=estimate_tokens(output_chars) if output_chars else 0,
        estimated=True,
    )


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Pipeline:
    def __init__(
        self,
        runtime: Runtime,
        ledger: SQLiteLedger,
        metrics: Metrics,
        breakers: BreakerBoard | None = None,
        limiter: RpmLimiter | None = None,
    ) -> None:
        self.runtime = runtime
        self.ledger = ledger
        self.metrics = metrics
        self.breakers = breakers or BreakerBoard(
            runtime.policy.breaker.failure_threshold, runtime.policy.breaker.open_seconds
        )
        self.limiter = limiter or RpmLimiter()
        self._background: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- entry points
    async def chat(self, req: ChatRequest, ctx: RequestContext) -> Reply:
        rt = self.runtime
        out = _Outcome("chat", req.model, stream=req.stream)
        try:
            plan = self._admit(rt, req.model, ctx, "chat", out)
            body = apply_params(req.body, plan.policy.params)
            key = self._cache_key(plan, body, ctx, out)
            if key is not None and out.cache == "miss":
                hit = await self._cache_get(rt, key)
                if hit is not None:
                    return self._replay(hit, req, ctx, out)
            if req.stream:
                return await self._chat_stream(rt, plan, body, req, ctx, out, key)
            result = await self._attempt(rt, plan, ctx, out, lambda p, t, s: p.chat(body, t, s))
            out.usage = result.usage
            if result.usage.input_tokens is None or result.usage.output_tokens is None:
                out.usage = _estimate(body, completion_chars(result.body))
            payload = orjson.dumps(result.body)
            if key is not None and _cacheable_result(result.body):
                self._cache_set(rt, key, payload, plan)
        except SwitchyardError as exc:
            self._failed(ctx, out, exc)
            raise
        self._record(ctx, out)
        return Reply(self._headers(ctx, out), body=payload)

    async def passthrough(self, endpoint: str, body: dict[str, Any], ctx: RequestContext) -> Reply:
        """/v1/completions and /v1/embeddings: routed, retried, metered; not cached."""
        rt = self.runtime
        out = _Outcome(endpoint, str(body.get("model")))
        try:
            plan = self._admit(rt, body.get("model"), ctx, endpoint, out)
            body = apply_params(body, plan.policy.params)

            async def call(provider: Any, target: Target, timeout: float) -> RawResult:
                if endpoint == "embeddings":
                    result: RawResult = await provider.embeddings(body, target, timeout)
                else:
                    result = await provider.completions(body, target, timeout)
                return result

            result = await self._attempt(rt, plan, ctx, out, call)
            out.usage = result.usage
        except SwitchyardError as exc:
            self._failed(ctx, out, exc)
            raise
        self._record(ctx, out)
        return Reply(self._headers(ctx, out), body=orjson.dumps(result.body))

    # ----------------------------------------------------------------- steps
    def _admit(self, rt: Runtime, model: object, ctx: RequestContext, kind: str, out: _Outcome) -> RoutePlan:
        """Route the request, then apply the tenant's rate limit."""
        plan = out.plan = rt.router.plan(model, ctx.principal, kind)
        tenant = rt.policy.tenants.get(ctx.principal.tenant)
        if tenant is not None:
            self.limiter.check(ctx.principal.tenant, tenant.rpm)
        return plan

    def _cache_key(
        self, plan: RoutePlan, body: dict[str, Any], ctx: RequestContext, out: _Outcome
    ) -> str | None:
        mode = plan.policy.cache.mode
        if mode == "off" or (mode == "deterministic" and not is_deterministic(body)):
            out.cache = "off"
            return None
        key = canonical_key(ctx.principal.tenant, plan.name, "chat", body)
        if ctx.cache_control_no_cache:
            out.cache = "bypass"
            self.metrics.cache.labels("bypass").inc()
            return key  # looked up never, refreshed after the call
        out.cache = "miss"
        return key

    async def _cache_get(self, rt: Runtime, key: str) -> bytes | None:
        value = await rt.cache.get(key)
        self.metrics.cache.labels("hit" if value is not None else "miss").inc()
        return value

    def _cache_set(self, rt: Runtime, key: str, payload: bytes, plan: RoutePlan) -> None:
        ttl = plan.policy.cache.ttl_s or rt.policy.cache.ttl_s
        task = asyncio.get_running_loop().create_task(rt.cache.set(key, payload, ttl))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _replay(self, hit: bytes, req: ChatRequest, ctx: RequestContext, out: _Outcome) -> Reply:
        out.cache = "hit"
        completion = orjson.loads(hit)
        out.usage = read_usage(completion.get("usage")) or Usage()
        out.target = None
        self._record(ctx, out)
        headers = self._headers(ctx, out)
        if not req.stream:
            return Reply(headers, body=hit)
        chunks = completion_to_chunks(completion, req.include_usage)

        async def replay() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield sse(chunk)
            yield DONE

        return Reply(headers, stream=replay())

    async def _attempt(
        self,
        rt: Runtime,
        plan: RoutePlan,
        ctx: RequestContext,
        out: _Outcome,
        fn: Callable[[Any, Target, float], Awaitable[Any]],
    ) -> Any:
        async def call(target: Target, timeout: float) -> Any:
            out.target = target
            ctx.attempts += 1
            self.metrics.retries.labels(target.provider, target.model).inc()
            t0 = time.perf_counter()
            try:
                return await fn(rt.providers[target.provider], target, timeout)
            finally:
                ctx.upstream_seconds += time.perf_counter() - t0

        def on_error(target: Target, exc: SwitchyardError) -> None:
            self.metrics.upstream_errors.labels(target.provider, target.model, exc.code or "error").inc()

        outcome = await run_with_fallback(plan, call, self.breakers, started=ctx.started, on_error=on_error)
        out.target = outcome.target
        return outcome.value

    # ----------------------------------------------------------------- streaming
    async def _chat_stream(
        self,
        rt: Runtime,
        plan: RoutePlan,
        body: dict[str, Any],
        req: ChatRequest,
        ctx: RequestContext,
        out: _Outcome,
        key: str | None,
    ) -> Reply:
        idle = plan.policy.stream_idle_timeout_s

        async def open_stream(provider: Any, target: Target, timeout: float) -> tuple[ChatStream, Any, Any]:
            stream: ChatStream = await provider.chat_stream(body, target, timeout, idle)
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

        stream, iterator, first = await self._attempt(rt, plan, ctx, out, open_stream)
        headers = self._headers(ctx, out)
        relay = self._relay(rt, plan, stream, iterator, first, req, ctx, out, key)

        async def on_close() -> None:
            if out.ttft is None and "recorded" not in ctx.extra:
                out.status, out.http_status = "client_disconnected", 499
                out.usage = stream.usage or _estimate(req.body, 0)
                self._record(ctx, out)
                await stream.aclose()

        return Reply(headers, stream=relay, on_close=on_close)

    async def _relay(
        self,
        rt: Runtime,
        plan: RoutePlan,
        stream: ChatStream,
        iterator: AsyncIterator[dict[str, Any]],
        first: dict[str, Any],
        req: ChatRequest,
        ctx: RequestContext,
        out: _Outcome,
        key: str | None,
    ) -> AsyncIterator[bytes]:
        assembler = StreamAssembler()
        include_usage = req.include_usage
        out.status = "client_disconnected"  # until proven otherwise
        try:
            assembler.add(first)
            out.ttft = time.perf_counter() - ctx.started
            yield sse(first)
            async for chunk in iterator:
                assembler.add(chunk)
                if not include_usage and not chunk.get("choices") and chunk.get("usage"):
                    continue  # the usage-only chunk the client did not ask for
                yield sse(chunk)
            out.status = "ok"
            yield DONE
        except (UpstreamError, StreamBrokenError) as exc:
            out.status, out.http_status, out.error_code = "stream_broken", 502, exc.code
            message = redact(exc.message, rt.secrets)
            yield sse({"error": {"message": message, "type": exc.type, "param": None, "code": exc.code}})
        finally:
            out.usage = stream.usage or _estimate(req.body, assembler.content_chars)
            if out.status == "client_disconnected":
                out.http_status = 499
            self._record(ctx, out)
            if out.status == "ok" and key is not None:
                self._cache_set(rt, key, orjson.dumps(assembler.completion()), plan)
            await stream.aclose()

    # ----------------------------------------------------------------- bookkeeping
    def _headers(self, ctx: RequestContext, out: _Outcome) -> dict[str, str]:
        headers = {
            "x-request-id": ctx.request_id,
            "x-switchyard-cache": "bypass" if out.cache in ("off", "bypass") else out.cache,
        }
        if out.plan is not None:
            headers["x-switchyard-route"] = out.plan.name
        if out.target is not None:
            headers["x-switchyard-model"] = out.target.model
            headers["x-switchyard-provider"] = out.target.provider
            headers["x-switchyard-attempts"] = str(ctx.attempts)
        return headers

    def _failed(self, ctx: RequestContext, out: _Outcome, exc: SwitchyardError) -> None:
        exc.message = redact(exc.message, self.runtime.secrets)  # upstreams may echo our keys
        out.status, out.http_status, out.error_code = "error", exc.status, exc.code
        if out.target is None:  # refused before any upstream call
            self.metrics.rejections.labels(exc.code or str(exc.status)).inc()
        self._record(ctx, out)  # every authenticated request gets its ledger row

    def _record(self, ctx: RequestContext, out: _Outcome) -> None:
        ctx.extra["recorded"] = True
        now = time.perf_counter()
        total = now - ctx.started
        plan, target, usage = out.plan, out.target, out.usage
        route = plan.name if plan is not None else ""
        served = target if out.cache != "hit" else None
        cost = cost_of(usage, served.price, output_expected=out.endpoint != "embeddings") if served else None
        if out.cache == "hit":
            cost = ZERO
        baseline = None
        if plan is not None and plan.baseline is not None:
            base_usage = Usage(usage.input_tokens, usage.output_tokens)  # baseline: no cache discount
            baseline = cost_of(base_usage, plan.baseline.price, output_expected=out.endpoint != "embeddings")
        model_label = served.model if served else ("cache" if out.cache == "hit" else "none")
        provider_label = served.provider if served else ("cache" if out.cache == "hit" else "none")
        m = self.metrics
        m.requests.labels(out.endpoint, route, model_label, provider_label, out.status, out.cache).inc()
        stream_label = "true" if out.stream else "false"
        m.latency.labels(out.endpoint, route, stream_label).observe(total)
        if out.ttft is not None:
            m.ttft.labels(route).observe(out.ttft)
            m.overhead.labels(out.endpoint, stream_label).observe(max(0.0, out.ttft - ctx.upstream_seconds))
        elif out.status == "ok":
            m.overhead.labels(out.endpoint, stream_label).observe(max(0.0, total - ctx.upstream_seconds))
        if served is not None:
            if usage.input_tokens:
                m.tokens.labels(route, served.model, "input").inc(usage.input_tokens)
            if usage.cached_input_tokens:
                m.tokens.labels(route, served.model, "cached_input").inc(usage.cached_input_tokens)
            if usage.output_tokens:
                m.tokens.labels(route, served.model, "output").inc(usage.output_tokens)
            m.record_cost(ctx.principal.tenant, route, served.model, served.provider, cost)
        self.ledger.write(
            LedgerRow(
                request_id=ctx.request_id,
                ts=ctx.started_wall,
                tenant=ctx.principal.tenant,
                key_id=ctx.principal.key_id,
                route=route or None,
                requested_model=out.requested,
                served_model=served.model if served else None,
                provider=served.provider if served else None,
                endpoint=out.endpoint,
                stream=out.stream,
                cache_status=out.cache,
                input_tokens=usage.input_tokens,
                cached_tokens=usage.cached_input_tokens,
                cache_write_tokens=usage.cache_write_tokens,
                output_tokens=usage.output_tokens,
                usage_estimated=usage.estimated,
                cost_usd=cost,
                baseline_cost_usd=baseline,
                latency_ms=total * 1000.0,
                ttft_ms=out.ttft * 1000.0 if out.ttft is not None else None,
                status=out.status,
                http_status=out.http_status,
                error_code=out.error_code,
                attempts=ctx.attempts,
                classifier_score=None,
            )
        )

    async def aclose(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _cacheable_result(body: dict[str, Any]) -> bool:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(c.get("finish_reason") in ("stop", "tool_calls", "length") for c in choices)
