"""Metering: what one request leaves behind once it is over (or refused) — request and
token metrics, cost and savings, the budget settlement, the OpenTelemetry span and the ledger
row. The flow fills the ``Exchange`` and calls ``record`` exactly once per request."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TypeVar

from gateway.core.ledger_row import LedgerRow, conversation_id
from gateway.core.types import Price, RequestFacts, Target, Usage
from gateway.flow import access_log
from gateway.flow.error_log import server_errors
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from gateway.ledger.meter import savings_cause
from gateway.ledger.pricing import cost_of

ZERO = Decimal("0E-10")
_R = TypeVar("_R")
_PRICED_MAX = 4096
# (price, output_expected) by id -> that price object (kept alive, so the id stays its own)
# and its costs by token counts: exact Decimal pricing costs tens of microseconds a call,
# and most requests repeat a (price, counts) pair (every cache hit's baseline does).
_priced: dict[tuple[int, bool], tuple[Price, dict[tuple[int | None, ...], Decimal | None]]] = {}


def priced(usage: Usage, price: Price, output_expected: bool) -> Decimal | None:
    """``ledger.pricing.cost_of``, memoised per price object and token counts (bounded)."""
    slot = _priced.get((id(price), output_expected))
    if slot is None or slot[0] is not price:
        if len(_priced) >= 256:
            _priced.clear()
        slot = _priced[(id(price), output_expected)] = (price, {})
    counts = (
        usage.input_tokens, usage.output_tokens, usage.cached_input_tokens,
        usage.cache_write_tokens, usage.cache_write_1h_tokens,
    )  # fmt: skip
    costs = slot[1]
    if counts in costs:
        return costs[counts]
    cost = cost_of(usage, price, output_expected=output_expected)
    if len(costs) >= _PRICED_MAX:
        costs.clear()
    costs[counts] = cost
    return cost


def record(svc: Services, ex: Exchange) -> None:
    """Everything a finished (or refused) request leaves behind: metrics, the budget
    settlement, the trace and its ledger row (whose commit ``durable`` awaits). Once only."""
    if ex.recorded:
        return
    ex.recorded = True
    try:
        _record(svc, ex)
    except BaseException:
        svc.limits.release(ex.reservation)  # never leave a reservation behind
        ex.reservation = None
        raise


def _record(svc: Services, ex: Exchange) -> None:
    total = time.perf_counter() - ex.started
    served = ex.target if not ex.cache_hit else None
    output_expected = ex.endpoint != "embeddings"  # embeddings have no output tokens to price
    cost = priced(ex.usage, served.price, output_expected) if served else None
    if ex.cache_hit:
        cost = ZERO
    _settle(svc, ex, cost)
    baseline = _baseline(ex, output_expected)
    base_model = ex.plan.baseline.model if ex.plan is not None and ex.plan.baseline is not None else None
    cause = savings_cause(ex.cache, served, cost, baseline, base_model, ex.batch_priced)
    _metrics(svc, ex, served, cost, total)
    if cause != "none" and baseline is not None and cost is not None:
        svc.metrics.record_savings(ex.principal.tenant, ex.route, cause, baseline - cost)
    if svc.tracer is not None:
        svc.tracer.record(_facts(svc, ex, served, cost, baseline))
    ex.commit = svc.ledger.submit(_row(ex, served, cost, baseline, cause, total))
    access_log.note(ex, served.model if served else None, total, enabled=svc.policy.server.access_log)
    if ex.http_status >= 500:
        server_errors.note(ex)


async def durable(ex: Exchange, reply: _R) -> _R:
    """Wait until this request's ledger row is committed, then hand back ``reply``: a client
    never sees a complete response whose row a crash could still lose. (The ledger gives up
    waiting after its wait timeout when the disk keeps failing.)"""
    commit, ex.commit = ex.commit, None
    if commit is not None:
        await commit
    return reply


def _baseline(ex: Exchange, output_expected: bool) -> Decimal | None:
    """What the route's reference model would have cost for the same tokens (no cache discount)."""
    if ex.zero_baseline:
        return ZERO  # a cascade's escalated attempt: its whole cost is extra
    if ex.plan is None or ex.plan.baseline is None:
        return None
    usage = Usage(ex.usage.input_tokens, ex.usage.output_tokens)
    return priced(usage, ex.plan.baseline.price, output_expected)


def _settle(svc: Services, ex: Exchange, cost: Decimal | None) -> None:
    """Budgets: settle the reservation to the real cost, the one the ledger row carries (release
    it when nothing was served, or the request failed before any usage was known); charge the
    tokens to the key's tokens-per-minute limit. A request that failed inside the gateway after
    the upstream answered is settled to what the upstream billed, so budgets and ledger agree.
    A conversation's new sticky model rides on the settlement's script when there is one."""
    reservation, ex.reservation = ex.reservation, None
    put, ex.sticky_write = ex.sticky_write, None
    if ex.target is None or ex.cache_hit or (ex.status == "error" and not cost):
        svc.limits.release(reservation)
    else:
        tokens = (ex.usage.input_tokens or 0) + (ex.usage.output_tokens or 0)
        if svc.limits.finish(svc.policy, ex.principal.key_id, tokens, reservation, cost, put):
            put = None  # the settlement's script carries the conversation's model
    if put is not None:
        svc.sticky.write(put)


def _metrics(svc: Services, ex: Exchange, served: Target | None, cost: Decimal | None, total: float) -> None:
    m, route, usage = svc.metrics, ex.route, ex.usage
    fallback = "cache" if ex.cache_hit else "none"
    model, provider = (served.model, served.provider) if served else (fallback, fallback)
    m.requests.labels(ex.endpoint, route, model, provider, ex.status, ex.cache).inc()
    stream = "true" if ex.stream else "false"
    m.latency.labels(ex.endpoint, route, stream).observe(total)
    if ex.ttft is not None:
        m.ttft.labels(route).observe(ex.ttft)
        m.overhead.labels(ex.endpoint, stream).observe(max(0.0, ex.ttft - ex.upstream_seconds))
    elif ex.status == "ok":
        m.overhead.labels(ex.endpoint, stream).observe(max(0.0, total - ex.upstream_seconds))
    if served is None:
        return
    for kind, n in (
        ("input", usage.input_tokens),
        ("cached_input", usage.cached_input_tokens),
        ("output", usage.output_tokens),
    ):
        if n:
            m.tokens.labels(route, served.model, kind).inc(n)
    m.record_cost(ex.principal.tenant, route, served.model, served.provider, cost)


def _facts(
    svc: Services, ex: Exchange, served: Target | None, cost: Decimal | None, baseline: Decimal | None
) -> RequestFacts:
    provider = svc.policy.providers.get(served.provider) if served else None
    return RequestFacts(
        ex.request_id, ex.started_wall, ex.endpoint, ex.requested, ex.route, served,
        provider.type if provider else None, ex.usage, cost, baseline, ex.cache,
        ex.status, ex.http_status, ex.error_code, ex.principal.tenant,
    )  # fmt: skip


def _row(
    ex: Exchange,
    served: Target | None,
    cost: Decimal | None,
    baseline: Decimal | None,
    cause: str,
    total: float,
) -> LedgerRow:
    usage = ex.usage
    return LedgerRow(
        request_id=ex.request_id,
        ts=ex.started_wall,
        tenant=ex.principal.tenant,
        key_id=ex.principal.key_id,
        route=ex.route or None,
        requested_model=ex.requested,
        served_model=served.model if served else None,
        provider=served.provider if served else None,
        endpoint=ex.endpoint,
        stream=ex.stream,
        cache_status=ex.cache,
        input_tokens=usage.input_tokens,
        cached_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
        usage_estimated=usage.estimated,
        cost_usd=cost,
        baseline_cost_usd=baseline,
        latency_ms=total * 1000.0,
        ttft_ms=ex.ttft * 1000.0 if ex.ttft is not None else None,
        status=ex.status,
        http_status=ex.http_status,
        error_code=ex.error_code,
        attempts=ex.attempts,
        classifier_score=ex.classifier_score,
        savings_cause=cause,
        route_decision=ex.route_decision,
        conversation=conversation_id(ex.conversation),
        compressed_tokens=ex.compressed_tokens,
        task=ex.task,
    )
