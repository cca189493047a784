"""Metering: what one request leaves behind once it is over (or refused) — request and
token metrics, cost and savings, the budget settlement, the OpenTelemetry span and the ledger
row. The pipeline collects the facts in an ``Outcome`` and calls ``record`` exactly once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from gateway.cache.semantic_layer import SemanticResult
from gateway.core.types import RequestContext, Target, Usage
from gateway.ledger.meter import savings_cause
from gateway.ledger.pricing import cost_of
from gateway.ledger.row import LedgerRow
from gateway.ledger.store import SQLiteLedger
from gateway.limits.gate import Limits
from gateway.routing.plan import RoutePlan
from gateway.runtime import Runtime
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import RequestFacts, RequestTracer

ZERO = Decimal("0E-10")
CACHE_HITS = ("hit", "semantic_hit")  # answered from a cache: cost 0, no upstream


class Recording(Protocol):
    """What ``record`` needs from the pipeline (read at call time: the app swaps limits/tracer)."""

    runtime: Runtime
    ledger: SQLiteLedger
    metrics: Metrics
    limits: Limits
    tracer: RequestTracer | None


@dataclass(slots=True)
class Outcome:
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
    semantic: SemanticResult | None = None  # the semantic-cache lookup, when the route ran one
    embedding: Any = None  # float32 (384,) vector of the last user message (shared with the classifier)


def record(p: Recording, ctx: RequestContext, out: Outcome) -> None:
    """Everything a finished (or refused) request leaves behind: metrics, the budget
    settlement, the trace and its ledger row (the commit future goes to ctx.extra)."""
    ctx.extra["recorded"] = True
    now = time.perf_counter()
    total = now - ctx.started
    plan, target, usage = out.plan, out.target, out.usage
    route = plan.name if plan is not None else ""
    served = target if out.cache not in CACHE_HITS else None
    cost = cost_of(usage, served.price, output_expected=out.endpoint != "embeddings") if served else None
    if out.cache in CACHE_HITS:
        cost = ZERO
    _settle(p, ctx, out, cost)
    baseline = None
    if plan is not None and plan.baseline is not None:
        base_usage = Usage(usage.input_tokens, usage.output_tokens)  # baseline: no cache discount
        baseline = cost_of(base_usage, plan.baseline.price, output_expected=out.endpoint != "embeddings")
    model_label = served.model if served else ("cache" if out.cache in CACHE_HITS else "none")
    provider_label = served.provider if served else ("cache" if out.cache in CACHE_HITS else "none")
    m = p.metrics
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
    if p.tracer is not None:
        _trace(p, ctx, out, route, served, cost, baseline)
    base_model = plan.baseline.model if plan is not None and plan.baseline is not None else None
    cause = savings_cause(out.cache, served, cost, baseline, base_model)
    if cause != "none" and baseline is not None and cost is not None:
        m.record_savings(ctx.principal.tenant, route, cause, baseline - cost)
    # Committed by the writer thread's next group commit; _durable() awaits it.
    ctx.extra["ledger_commit"] = p.ledger.submit(
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
            classifier_score=ctx.extra.get("classifier_score"),
            savings_cause=cause,
            route_decision=ctx.extra.get("route_decision"),
        )
    )


def _trace(
    p: Recording,
    ctx: RequestContext,
    out: Outcome,
    route: str,
    served: Target | None,
    cost: Decimal | None,
    baseline: Decimal | None,
) -> None:
    assert p.tracer is not None
    provider = p.runtime.policy.providers.get(served.provider) if served else None
    p.tracer.record(
        RequestFacts(
            ctx.request_id, ctx.started_wall, out.endpoint, out.requested, route, served,
            provider.type if provider else None, out.usage, cost, baseline, out.cache,
            out.status, out.http_status, out.error_code, ctx.principal.tenant,
        )
    )  # fmt: skip


def _settle(p: Recording, ctx: RequestContext, out: Outcome, cost: Decimal | None) -> None:
    """Budgets: settle the reservation to the real cost (release it on failure); charge the
    tokens to the key's tokens-per-minute limit."""
    reservation = ctx.extra.pop("budget", None)
    usage, target = out.usage, out.target
    if target is None or out.cache in CACHE_HITS or out.status == "error":
        p.limits.release(reservation)
        return
    tokens = (usage.input_tokens or 0) + (usage.output_tokens or 0)
    p.limits.record_tokens(p.runtime.policy, ctx.principal.key_id, tokens)
    if reservation is not None:
        p.limits.settle(reservation, cost)
