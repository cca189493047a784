"""The provider call: retries, fallbacks, breakers, engine spill-over and conversation
stickiness (the port ``svc.sticky``: in process, or shared through Redis) around one port call,
and the tokenizer's estimate for an upstream that reported no usage."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.core.batch import BATCH_ITEM, UPSTREAM_IDEMPOTENCY_KEY, idempotency_key
from gateway.core.errors import SwitchyardError
from gateway.core.ports import Provider
from gateway.core.types import Target, Usage
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from gateway.ledger.meter import estimate_usage
from gateway.routing.attempts import run_with_fallback
from gateway.routing.plan import RoutePlan
from gateway.routing.sticky import prefer

_R = TypeVar("_R")
Call = Callable[[Provider, Target, float], Awaitable[_R]]


async def attempt(svc: Services, plan: RoutePlan, ex: Exchange, fn: Call[_R]) -> _R:
    """Call ``fn`` on the plan's targets with retries, fallbacks and breakers."""

    async def call(target: Target, timeout: float) -> _R:
        ex.target = target
        ex.attempts += 1
        svc.metrics.retries.labels(target.provider, target.model).inc()
        item = BATCH_ITEM.get()
        key = None
        if item is not None:  # a batch item: its send recorded first, then sent with its key
            await item.before_send()
            key = UPSTREAM_IDEMPOTENCY_KEY.set(
                idempotency_key(item.key, target.provider, target.upstream_model)
            )
        t0 = time.perf_counter()
        try:
            return await fn(svc.providers[target.provider], target, timeout)
        finally:
            ex.upstream_seconds += time.perf_counter() - t0
            if key is not None:
                UPSTREAM_IDEMPOTENCY_KEY.reset(key)

    def on_error(target: Target, exc: SwitchyardError) -> None:
        svc.metrics.upstream_errors.labels(target.provider, target.model, exc.code or "error").inc()

    conversation = ex.conversation
    known = None if conversation is None else await svc.sticky.recall(conversation, ex.sticky_read)
    plan, sticky = prefer(plan, known)  # the conversation's model first
    plan = svc.engines.spill(plan, svc.metrics.count_spillover)  # saturated engines go last
    outcome = await run_with_fallback(plan, call, svc.breakers, started=ex.started, on_error=on_error)
    ex.target = outcome.target
    if sticky and outcome.target.model == plan.targets[0].model:
        ex.route_decision = "sticky"
    if conversation is not None:  # written by the settlement's script, or by the store itself
        ex.sticky_write = svc.sticky.remember(conversation, outcome.target.model, known)
    return outcome.value


def estimate(
    body: dict[str, Any], completion: dict[str, Any] | None, ex: Exchange, reported: Usage | None
) -> Usage:
    """Usage counted with the served model's tokenizer (marked estimated) for an upstream that
    reported none (or only part: what it did report is kept)."""
    model = ex.target.upstream_model if ex.target is not None else str(body.get("model") or "")
    return estimate_usage(body, completion, model, reported)


def metered(
    svc: Services,
    body: dict[str, Any],
    completion: dict[str, Any] | None,
    ex: Exchange,
    reported: Usage | None,
) -> Usage:
    """The usage to meter: the upstream's when it gave both counts in range; else the gaps
    (missing, or dropped at the provider edge as impossible: ``estimated`` set) filled in by
    the tokenizer, marked estimated and counted in ``switchyard_usage_estimated``."""
    if (
        reported is not None
        and not reported.estimated
        and reported.input_tokens is not None
        and reported.output_tokens is not None
    ):
        return reported
    reason = "invalid" if reported is not None and reported.estimated else "missing"
    provider = ex.target.provider if ex.target is not None else ""
    svc.metrics.usage_estimated.labels(provider, reason).inc()
    return estimate(body, completion, ex, reported)
