"""A batch's worst case on the budgets: when the batch is created every valid item's worst
case is reserved, as the item's own request would reserve it (the route's params applied, its
spill-over route a second candidate), so a batch the budgets cannot hold is refused whole
(429 ``budget_exceeded``) before anything runs. Each hold is released as its item starts (the
run reserves for itself and settles to the real cost) or when the batch is cancelled or
expires (``Services.batch_holds``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway.core.batch import NewItem
from gateway.core.errors import SwitchyardError
from gateway.core.types import Principal
from gateway.flow.services import Services
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan


def _route(svc: Services, who: Principal, model: Any, kind: str) -> tuple[RoutePlan, list[Any]] | None:
    try:
        plan = svc.router.plan(model, who, kind)
    except SwitchyardError:
        return None  # the item fails as its request would when it runs
    plans = [plan]
    spill = plan.policy.on_budget_exceeded.spill_to
    if spill is not None:
        plans.append(svc.router.plan(spill, who, plan.kind))
    return plan, [svc.limits.candidate(svc.policy, p.name, p.kind, p.policy, p.targets) for p in plans]


async def reserve(svc: Services, who: Principal, endpoint: str, items: Sequence[NewItem]) -> dict[int, Any]:
    """The holds of ``items`` (index -> reservation); none taken when one is refused."""
    kind = "embeddings" if endpoint == "/v1/embeddings" else "chat"
    routes: dict[str, tuple[RoutePlan, list[Any]] | None] = {}
    holds: dict[int, Any] = {}
    try:
        for item in items:
            if item.body is None:
                continue
            body = orjson.loads(item.body)
            model = str(body.get("model"))
            if model not in routes:
                routes[model] = _route(svc, who, model, kind)
            route = routes[model]
            if route is None:
                continue
            plan, cands = route
            body = apply_params(body, plan.policy.params)
            _, held = await svc.limits.reserve(svc.policy, who.tenant, who.key_id, body, cands)
            if held is not None:
                holds[item.idx] = held
    except BaseException:
        for held in holds.values():
            svc.limits.release(held)
        raise
    return holds


def release(svc: Services, holds: Sequence[Any]) -> None:
    for held in holds:
        svc.limits.release(held)
