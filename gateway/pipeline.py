"""The one orchestrator of a request: limits -> exact cache -> semantic cache -> classifier ->
budget reservation -> provider (retries, fallbacks, breakers, engine spill-over) -> metering
(gateway/metering.py: ledger row, metrics, settlement) -> caches. Handlers call it; it knows no HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.cache.replay import StreamAssembler, completion_to_chunks
from gateway.cache.semantic_key import last_user_text
from gateway.cache.semantic_layer import SemanticLayer, SemanticResult
from gateway.core.errors import StreamBrokenError, SwitchyardError, UpstreamError
from gateway.core.redact import redact
from gateway.core.types import ChatRequest, ChatStream, RawResult, RequestContext, Target, Usage
from gateway.core.types import usage_from_openai as read_usage
from gateway.ledger.meter import estimate_usage
from gateway.ledger.store import SQLiteLedger
from gateway.limits.gate import Limits
from gateway.limits.ratelimit import RpmLimiter
from gateway.metering import Outcome, record
from gateway.routing.attempts import run_with_fallback
from gateway.routing.breaker import BreakerBoard
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan
from gateway.runtime import Runtime
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.prompt_log import log_exchange
from gateway.telemetry.tracing import RequestTracer

log = logging.getLogger("switchyard")
DONE = b"data: [DONE]\n\n"
_R = TypeVar("_R")


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


def _estimate(
    body: dict[str, Any], completion: dict[str, Any] | None, target: Target | None, reported: Usage | None
) -> Usage:
    """Usage counted with the served model's tokenizer (marked estimated) for an upstream that
    reported none (or only part: what it did report is kept)."""
    model = target.upstream_model if target is not None else str(body.get("model") or "")
    return estimate_usage(body, completion, model, reported)


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
        self.limits = Limits()  # rate limits + budgets; the app replaces it (Redis, key store)
        self.tracer: RequestTracer | None = None  # OpenTelemetry, when configured
        self._background: set[asyncio.Task[None]] = set()
        self.semantic = SemanticLayer()  # embedder + semantic cache, loaded on first use; app replaces it

    # ----------------------------------------------------------------- entry points
    async def chat(self, req: ChatRequest, ctx: RequestContext) -> Reply:
        rt = self.runtime
        out = Outcome("chat", req.model, stream=req.stream)
        try:
            plan = self._admit(rt, req.model, ctx, "chat", out)
            await self.limits.admit(rt.policy, ctx.principal.tenant, ctx.principal.key_id)
            body = apply_params(req.body, plan.policy.params)
            key = self._cache_key(plan, body, ctx, out)
            if key is not None and out.cache == "miss":
                hit = await self._cache_get(rt, key)
                if hit is not None:
                    return await self._durable(ctx, self._replay(hit, req, ctx, out))
                sem = await self._semantic_get(rt, plan, body, ctx, out)
                if sem is not None and sem.lookup.payload is not None:
                    reply = self._replay(sem.lookup.payload, req, ctx, out, "semantic_hit")
                    return await self._durable(ctx, reply)
            plan = await self._classify(plan, body, ctx, out)
            plan = await self._reserve(rt, plan, body, ctx, out)
            if req.stream:
                return await self._chat_stream(rt, plan, body, req, ctx, out, key)
            result = await self._attempt(rt, plan, ctx, out, lambda p, t, s: p.chat(body, t, s))
            out.usage = result.usage
            if result.usage.input_tokens is None or result.usage.output_tokens is None:
                out.usage = _estimate(body, result.body, out.target, result.usage)
            payload = orjson.dumps(result.body)
            log_exchange(rt.policy, ctx.request_id, ctx.principal.tenant, body, result.body)
            if key is not None and _cacheable_result(result.body):
                self._cache_set(rt, key, payload, plan)
                self._semantic_set(rt, plan, out, payload)
        except SwitchyardError as exc:
            self._failed(ctx, out, exc)
            await self._durable(ctx, None)
            raise
        self._record(ctx, out)
        return await self._durable(ctx, Reply(self._headers(ctx, out), body=payload))

    async def passthrough(self, endpoint: str, body: dict[str, Any], ctx: RequestContext) -> Reply:
        """/v1/completions and /v1/embeddings: routed, retried, metered; not cached."""
        rt = self.runtime
        out = Outcome(endpoint, str(body.get("model")))
        try:
            plan = self._admit(rt, body.get("model"), ctx, endpoint, out)
            await self.limits.admit(rt.policy, ctx.principal.tenant, ctx.principal.key_id)
            body = apply_params(body, plan.policy.params)
            plan = await self._reserve(rt, plan, body, ctx, out)

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
            await self._durable(ctx, None)
            raise
        self._record(ctx, out)
        return await self._durable(ctx, Reply(self._headers(ctx, out), body=orjson.dumps(result.body)))

    # ----------------------------------------------------------------- steps
    def _admit(self, rt: Runtime, model: object, ctx: RequestContext, kind: str, out: Outcome) -> RoutePlan:
        """Route the request (rate limits follow in ``limits.admit``)."""
        plan = out.plan = rt.router.plan(model, ctx.principal, kind)
        return plan

    async def _classify(
        self, plan: RoutePlan, body: dict[str, Any], ctx: RequestContext, out: Outcome
    ) -> RoutePlan:
        """Routes with a classifier: score the last user message (reusing the semantic cache's
        vector) and try the tier the score picks first (gateway/routing/tiers.py)."""
        if plan.auto is None:
            return plan
        choice = await plan.auto.choose(plan, last_user_text(body), out.embedding, self.semantic.embedder)
        ctx.extra["classifier_score"], ctx.extra["route_decision"] = choice.score, choice.tier
        self.metrics.route_decisions.labels(plan.name, choice.tier).inc()
        out.plan = choice.plan
        return choice.plan

    async def _reserve(
        self, rt: Runtime, plan: RoutePlan, body: dict[str, Any], ctx: RequestContext, out: Outcome
    ) -> RoutePlan:
        """Reserve the worst-case cost on the budgets; spill to the route's fallback if asked."""
        plans = [plan]
        spill = plan.policy.on_budget_exceeded.spill_to
        if spill is not None:
            plans.append(rt.router.plan(spill, ctx.principal, plan.kind))
        cands = [self.limits.candidate(rt.policy, p.name, p.kind, p.policy, p.targets) for p in plans]
        p = ctx.principal
        index, ctx.extra["budget"] = await self.limits.reserve(rt.policy, p.tenant, p.key_id, body, cands)
        out.plan = plans[index]
        return plans[index]

    def _cache_key(
        self, plan: RoutePlan, body: dict[str, Any], ctx: RequestContext, out: Outcome
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

    async def _semantic_get(
        self, rt: Runtime, plan: RoutePlan, body: dict[str, Any], ctx: RequestContext, out: Outcome
    ) -> SemanticResult | None:
        """After an exact miss, on routes with ``semantic_cache.enabled``: embed once, look up.
        Any failure (model, Redis) is a miss, never a failed request."""
        if not plan.policy.semantic_cache.enabled:
            return None
        try:
            sem = await self.semantic.lookup(rt.policy, plan.name, ctx.principal.tenant, body)
        except Exception:
            log.exception("semantic cache lookup failed; served as a miss")
            self.metrics.cache.labels("semantic_miss").inc()
            return None
        if sem is None:
            return None
        out.semantic, out.embedding = sem, sem.vector
        self.metrics.semantic_lookup.labels(plan.name).observe(sem.seconds)
        self.metrics.cache.labels("semantic_hit" if sem.lookup.hit else "semantic_miss").inc()
        return sem

    def _semantic_set(self, rt: Runtime, plan: RoutePlan, out: Outcome, payload: bytes) -> None:
        if out.semantic is not None and not out.semantic.lookup.hit:
            cfg = plan.policy.semantic_cache
            ttl = cfg.ttl_s or plan.policy.cache.ttl_s or rt.policy.cache.ttl_s
            try:
                self.semantic.store(out.semantic, payload, ttl)
            except Exception:
                log.exception("semantic cache store failed")

    def _replay(
        self, hit: bytes, req: ChatRequest, ctx: RequestContext, out: Outcome, status: str = "hit"
    ) -> Reply:
        out.cache = status
        completion = orjson.loads(hit)
        usage = read_usage(completion.get("usage"))
        if usage is None or usage.input_tokens is None:  # first metered by estimate: again, for the baseline
            usage = _estimate(req.body, completion, out.plan.baseline if out.plan else None, usage)
        out.usage = usage
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
        out: Outcome,
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

        plan = rt.engines.spill(plan, self.metrics.count_spillover)  # saturated engines go last
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
        out: Outcome,
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
                out.usage = stream.usage or _estimate(req.body, None, out.target, None)
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
        out: Outcome,
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
            completion = assembler.completion()
            log_exchange(rt.policy, ctx.request_id, ctx.principal.tenant, req.body, completion)
            out.usage = stream.usage or _estimate(req.body, completion, out.target, None)
            self._record(ctx, out)
            await self._durable(ctx, None)  # the ledger row is committed before [DONE] goes out
            if key is not None:
                self._cache_set(rt, key, orjson.dumps(completion), plan)
                self._semantic_set(rt, plan, out, orjson.dumps(completion))
            yield DONE
        except (UpstreamError, StreamBrokenError) as exc:
            out.status, out.http_status, out.error_code = "stream_broken", 502, exc.code
            message = redact(exc.message, rt.secrets)
            yield sse({"error": {"message": message, "type": exc.type, "param": None, "code": exc.code}})
        finally:
            if "recorded" not in ctx.extra:  # broken or abandoned (an ok stream recorded above)
                out.usage = stream.usage or _estimate(req.body, assembler.completion(), out.target, None)
                if out.status == "client_disconnected":
                    out.http_status = 499
                self._record(ctx, out)
            await stream.aclose()

    # ----------------------------------------------------------------- bookkeeping
    def _headers(self, ctx: RequestContext, out: Outcome) -> dict[str, str]:
        headers = {
            "x-request-id": ctx.request_id,
            "x-switchyard-cache": "bypass" if out.cache in ("off", "bypass") else out.cache,
        }
        if out.cache == "semantic_hit" and out.semantic is not None:
            headers["x-switchyard-cache"] = "semantic"
            headers["x-switchyard-semantic-score"] = f"{out.semantic.lookup.score:.3f}"
        if out.plan is not None:
            headers["x-switchyard-route"] = out.plan.name
        if out.target is not None:
            headers["x-switchyard-model"] = out.target.model
            headers["x-switchyard-provider"] = out.target.provider
            headers["x-switchyard-attempts"] = str(ctx.attempts)
        return headers

    def _failed(self, ctx: RequestContext, out: Outcome, exc: SwitchyardError) -> None:
        exc.message = redact(exc.message, self.runtime.secrets)  # upstreams may echo our keys
        out.status, out.http_status, out.error_code = "error", exc.status, exc.code
        if out.target is None:  # refused before any upstream call
            self.metrics.rejections.labels(exc.code or str(exc.status)).inc()
        self._record(ctx, out)  # every authenticated request gets its ledger row

    def _record(self, ctx: RequestContext, out: Outcome) -> None:
        """Metrics, budget settlement, trace and the ledger row (gateway/metering.py)."""
        record(self, ctx, out)

    async def _durable(self, ctx: RequestContext, reply: _R) -> _R:
        """Wait until this request's ledger row is committed, then hand back ``reply``: a
        client never sees a complete response whose row a crash could still lose. (The ledger
        gives up waiting after its ``wait_timeout`` when the disk keeps failing.)"""
        commit = ctx.extra.pop("ledger_commit", None)
        if commit is not None:
            await commit
        return reply

    async def aclose(self) -> None:
        await self.limits.aclose()
        await self.semantic.aclose()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _cacheable_result(body: dict[str, Any]) -> bool:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(c.get("finish_reason") in ("stop", "tool_calls", "length") for c in choices)
