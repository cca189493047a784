"""The one orchestrator of a request: plan -> rate limits -> exact cache -> semantic cache ->
classifier -> budget reservation -> provider (retries, fallbacks, breakers, engine spill-over)
-> metering (flow/metering.py) -> caches. Streams continue in flow/stream.py.

Every chat-like protocol takes the same steps: handlers call ``serve`` with the request's
protocol adapter (gateway/flow/adapters/), which translated the wire body once into the
``RequestRecord`` the steps read and renders the answer back; embeddings and completions
models call ``passthrough``. Nothing here knows HTTP, and I/O happens only through
core.ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.cache.semantic_key import last_user_text
from gateway.core.errors import InternalError, SwitchyardError
from gateway.core.ports import Provider
from gateway.core.redact import redact
from gateway.core.request import RequestRecord
from gateway.core.types import RawResult, Target
from gateway.flow import caching, cascade, compress, learning, shadow
from gateway.flow.adapters.base import Inbound
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.reply import Reply, headers
from gateway.flow.services import Services
from gateway.flow.stream import open_stream
from gateway.flow.upstream import attempt, metered
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan
from gateway.routing.sticky import conversation_key
from gateway.telemetry.prompt_log import log_exchange

log = logging.getLogger("switchyard")


# --------------------------------------------------------------------------- entry points
async def serve(svc: Services, inbound: Inbound, ex: Exchange) -> Reply:
    """Any chat-like request (chat, completions over chat, Messages, Responses), as its
    protocol's adapter translated it: the same steps whatever the protocol."""
    ex.endpoint, ex.requested, ex.stream = inbound.endpoint, inbound.model, inbound.stream
    async with guarded(svc, ex):
        await inbound.prepare(ex)
        rec = inbound.record
        ex.task = rec.task()
        plan = await admit(svc, rec, ex)
        rec = compress.step(inbound, plan, ex)  # the route's prompt compression, wire and record
        inbound.apply(plan.policy.params)
        rec = inbound.record
        key = caching.cache_key(svc, plan, inbound, ex)
        if key is not None and ex.cache == "miss":
            hit = await caching.cache_get(svc, key, ex)
            if hit is not None:
                return await caching.replay(svc, inbound, hit, ex, "hit")
            sem = await caching.semantic_get(svc, plan, rec.body, ex, inbound.answers)
            if sem is not None and sem.lookup.payload is not None:
                return await caching.replay(svc, inbound, sem.lookup.payload, ex, "semantic_hit")
        plan = await classify(svc, plan, rec, ex)
        plan = learning.choose(svc, plan, ex)  # a learned route: its target for (tenant, task)
        plan = await reserve(svc, plan, rec.body, ex)
        if rec.stream:
            cascade.declined(plan, ex)  # a cascade route serves streams as usual
            return await open_stream(svc, plan, inbound, ex, key)
        answer = await cascade.answer(svc, plan, ex, inbound)  # attempt, or cheap-then-verify
        ex.usage = metered(svc, rec.body, answer.completion, ex, answer.usage)
        payload = await inbound.render(answer, ex)
        log_exchange(svc.policy, ex.request_id, ex.principal.tenant, rec.body, answer.completion)
        if key is not None:
            cached = inbound.cached(answer, ex.usage)
            if cached is not None:
                caching.store(svc, plan, ex, key, cached)
        shadow.maybe(svc, plan, inbound, ex, answer)  # a sampled background evaluation
    record(svc, ex)
    return await durable(ex, Reply(inbound.headers(ex), body=payload))


async def passthrough(svc: Services, endpoint: str, body: dict[str, Any], ex: Exchange) -> Reply:
    """/v1/embeddings, and /v1/completions to a model of kind ``completions``: routed,
    limited, reserved, retried, metered like every request; not cached, never streamed."""
    ex.endpoint, ex.requested = endpoint, str(body.get("model"))
    async with guarded(svc, ex):
        rec = RequestRecord(endpoint, ex.requested, body, stream=False)
        plan = await admit(svc, rec, ex, kind=endpoint)
        body = apply_params(body, plan.policy.params)
        plan = await reserve(svc, plan, body, ex)

        async def call(provider: Provider, target: Target, timeout: float) -> RawResult:
            if endpoint == "embeddings":
                return await provider.embeddings(body, target, timeout)
            return await provider.completions(body, target, timeout)

        result = await attempt(svc, plan, ex, call)
        ex.usage = metered(svc, body, result.body if endpoint == "completions" else None, ex, result.usage)
        payload = orjson.dumps(result.body)
    record(svc, ex)
    return await durable(ex, Reply(headers(ex), body=payload))


# --------------------------------------------------------------------------- steps
async def admit(svc: Services, rec: RequestRecord, ex: Exchange, kind: str = "chat") -> RoutePlan:
    """Route the request, then apply the rate limits. With shared (Redis) limits the budget
    reservation ``reserve`` will need (on the body with the route's params) is taken in the
    same round trip (routes with a classifier excepted: their plan is known only later), and
    so is the read of a conversation's shared sticky model (named here, on the body as sent)."""
    plan = ex.plan = svc.router.resolve(rec.model, ex.principal, kind)
    svc.router.require_targets(plan)  # refused with the route known: its row names it
    who = ex.principal
    peek = None
    if kind == "chat":  # the conversation's sticky model is read in the same round trip
        ex.conversation = conversation_key(who.tenant, plan.name, rec.body, rec.conversation_hint)
        if ex.conversation is not None:
            peek = ex.sticky_read = svc.sticky.peek(ex.conversation)
    if plan.auto is not None or not svc.limits.shared:
        await svc.limits.admit(svc.policy, who.tenant, who.key_id, peek=peek)
        return plan
    cands = _candidates(svc, plan, ex)[1]
    body = apply_params(rec.body, plan.policy.params)
    ex.reservation = await svc.limits.admit(
        svc.policy, who.tenant, who.key_id, body=body, candidates=cands, peek=peek
    )
    return plan


async def classify(svc: Services, plan: RoutePlan, rec: RequestRecord, ex: Exchange) -> RoutePlan:
    """Routes with a classifier: score the last user message (reusing the semantic cache's
    vector) and try the tier the score picks first (gateway/routing/tiers.py)."""
    if plan.auto is None:
        return plan
    choice = await plan.auto.choose(plan, last_user_text(rec.body), ex.embedding, svc.semantic.embedder)
    ex.classifier_score, ex.route_decision = choice.score, choice.tier
    svc.metrics.route_decisions.labels(plan.name, choice.tier).inc()
    ex.plan = choice.plan
    return choice.plan


def _candidates(svc: Services, plan: RoutePlan, ex: Exchange) -> tuple[list[RoutePlan], list[Any]]:
    """The plans a request may be reserved on (the route, then its spill_to) and their budget
    candidates."""
    plans = [plan]
    spill = plan.policy.on_budget_exceeded.spill_to
    if spill is not None:
        plans.append(svc.router.plan(spill, ex.principal, plan.kind))
    return plans, [svc.limits.candidate(svc.policy, p.name, p.kind, p.policy, p.targets) for p in plans]


async def reserve(svc: Services, plan: RoutePlan, body: dict[str, Any], ex: Exchange) -> RoutePlan:
    """Reserve the worst-case cost on the budgets; spill to the route's fallback if asked.
    What ``admit`` already reserved for the same plans is taken over (no second round trip)."""
    plans, cands = _candidates(svc, plan, ex)
    who = ex.principal
    held, ex.reservation = ex.reservation, None
    try:
        index, ex.reservation = await svc.limits.reserve(
            svc.policy, who.tenant, who.key_id, body, cands, held=held
        )
    except BaseException:
        svc.limits.release(held)  # refused or failed: nothing of the admission's stays held
        raise
    ex.plan = plans[index]
    return plans[index]


# --------------------------------------------------------------------------- bookkeeping
async def failed(svc: Services, ex: Exchange, exc: SwitchyardError) -> None:
    """A request that ends in an error: redact the message, record the row, wait for it."""
    exc.message = redact(exc.message, svc.secrets)  # upstreams may echo our keys
    ex.status, ex.http_status, ex.error_code = "error", exc.status, exc.code or exc.type
    if ex.target is None:  # refused before any upstream call
        svc.metrics.rejections.labels(ex.error_code).inc()
    record(svc, ex)  # every authenticated request gets its ledger row
    await durable(ex, None)


@contextlib.asynccontextmanager
async def guarded(svc: Services, ex: Exchange) -> AsyncIterator[None]:
    """Every way out of a request's steps leaves its row and settles or releases its budget: an
    error of the tree is recorded and re-raised, a cancellation is a 499, a bug is a 500."""
    try:
        yield
    except SwitchyardError as exc:
        await failed(svc, ex, exc)
        raise
    except asyncio.CancelledError:
        abandoned(svc, ex)
        raise
    except Exception as exc:
        raise await unexpected(svc, ex, exc) from exc


async def unexpected(svc: Services, ex: Exchange, exc: BaseException) -> InternalError:
    """A bug inside the gateway (any exception that is not a SwitchyardError): log it, release
    what the request reserved, leave its ledger row (error, 500) and hand back the 500 to raise."""
    log.error("unexpected error in request %s", ex.request_id, exc_info=exc)
    error = InternalError(f"Internal gateway error (request id {ex.request_id})")
    await failed(svc, ex, error)
    return error


def abandoned(svc: Services, ex: Exchange) -> None:
    """The request's task was cancelled (the client left, the server is stopping): nothing was
    delivered, so the reservation is released and the row says 499."""
    if not ex.recorded:
        ex.status, ex.http_status = "client_disconnected", 499
        svc.limits.release(ex.reservation)
        ex.reservation = None
        record(svc, ex)
