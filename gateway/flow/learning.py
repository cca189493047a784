"""Feedback and the learned routes, in the flow: ``POST /v1/feedback`` (``post``), the learned
route's choice of target per (tenant, task) (``choose``, one pipeline step) and the loop that
keeps every replica's learners in step with the shared database (``sync``)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, Final

from gateway.core.errors import BadRequestError, NotConfiguredError, NotFoundError
from gateway.core.types import Principal
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from gateway.routing.learned_routes import abilities, learned_routes
from gateway.routing.plan import RoutePlan

log = logging.getLogger("switchyard")
MAX_ID: Final = 200
FIELDS: Final = frozenset({"request_id", "score"})


def parse(data: Any) -> tuple[str, float]:
    """The (request id, score) of a feedback body, or a 400 that says what is wrong."""
    if not isinstance(data, dict):
        raise BadRequestError('The body must be a JSON object: {"request_id": "...", "score": 0..1}')
    extra = sorted(set(data) - FIELDS)
    if extra:
        names = ", ".join(map(repr, extra))
        raise BadRequestError(f"Unknown field(s) {names}; send request_id and score", param=extra[0])
    request_id = data.get("request_id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > MAX_ID:
        raise BadRequestError(
            "'request_id' must be the x-request-id of a request you made (a non-empty string)",
            param="request_id",
        )
    score = data.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise BadRequestError("'score' must be a number from 0 (bad) to 1 (good)", param="score")
    if not 0.0 <= score <= 1.0:
        raise BadRequestError(f"'score' must be between 0 and 1, got {score}", param="score")
    return request_id, float(score)


async def post(svc: Services, tenant: str, data: Any) -> dict[str, Any]:
    """Store a score for one of the tenant's served requests and teach its learned route."""
    request_id, score = parse(data)
    if svc.feedback is None:
        raise NotConfiguredError("Feedback needs a ledger database; this gateway runs with none")
    owner = await svc.feedback.submit(tenant, request_id, score)
    if owner is None:
        raise NotFoundError(f"No request '{request_id}' of yours is in the ledger", param="request_id")
    if owner.route and owner.task and owner.model:
        explore = (owner.decision or "").startswith("explore:")
        svc.learned.observe(owner.route, tenant, owner.task, owner.model, score, explore)
    return {"object": "feedback", "request_id": request_id, "score": score}


def choose(svc: Services, plan: RoutePlan, ex: Exchange) -> RoutePlan:
    """A learned route: the target its learner picks for the request's (tenant, task) goes
    first (the others stay fallbacks); the ledger row says explore or exploit, and the task."""
    if plan.policy.learn is None or ex.task is None:
        return plan
    decision = svc.learned.decide(plan, ex.principal.tenant, ex.task, abilities(svc.policy))
    ex.route_decision = decision.label
    ex.plan = decision.plan
    return decision.plan


async def sync(current: Callable[[], Services]) -> None:
    """Re-read every learned route's evidence from the shared database, at start and then
    every ``learn.sync_s`` (the shortest of the routes'): restarts and replicas converge."""
    while True:
        svc = current()
        names = learned_routes(svc.policy)
        syncs = [learn.sync_s for n in names if (learn := svc.policy.routes[n].learn) is not None]
        wait = min(syncs, default=30.0)
        if svc.feedback is not None:
            for name in names:
                try:
                    await load(svc, name)
                except Exception:  # the database is down: keep the evidence in memory
                    log.warning("learned route %s: could not re-read its evidence", name, exc_info=True)
        await asyncio.sleep(wait)


async def load(svc: Services, name: str) -> int:
    """One route's evidence from the database into its learners; returns the learners."""
    store = svc.feedback
    if store is None:
        return 0
    plan = svc.router.resolve(name, Principal(tenant=""), "chat")
    outcomes, requests, explored = await store.call(
        lambda: (store.outcomes(name), store.requests_per_task(name), store.explored_per_task(name))
    )
    return svc.learned.load(plan, outcomes, requests, abilities(svc.policy), explored)
