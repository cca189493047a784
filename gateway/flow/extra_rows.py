"""Upstream calls a request makes besides its answer (a cascade's escalated attempt, a shadow
evaluation's candidate and judge calls): each is its own ledger row, ``<request id>-<suffix>``,
with a baseline of 0 (it saved nothing: its whole cost is extra, so the savings reports subtract
it) and its cost settled on the budgets like any request's."""

from __future__ import annotations

from typing import Any

from gateway.core.errors import SwitchyardError
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.services import Services
from gateway.routing.plan import RoutePlan


def extra(ex: Exchange, suffix: str, decision: str, plan: RoutePlan | None = None) -> Exchange:
    """A new exchange for an extra call of ``ex``'s request (same caller, route and task)."""
    x = Exchange(
        f"{ex.request_id}-{suffix}", ex.principal, ex.started, ex.started_wall,
        endpoint=ex.endpoint, requested=ex.requested, plan=plan or ex.plan, task=ex.task,
    )  # fmt: skip
    x.route_decision, x.zero_baseline = decision, True
    return x


async def settle(svc: Services, x: Exchange, body: dict[str, Any]) -> None:
    """Put ``x``'s cost on the budgets (reserved on its served target, then settled), leave its
    row and wait for the commit. A spent budget does not hide the row: it still says the cost."""
    plan, target = x.plan, x.target
    if plan is not None and target is not None:
        cand = svc.limits.candidate(svc.policy, plan.name, plan.kind, plan.policy, (target,))
        try:
            who = x.principal
            _, x.reservation = await svc.limits.reserve(svc.policy, who.tenant, who.key_id, body, [cand])
        except SwitchyardError:
            x.reservation = None
    record(svc, x)
    await durable(x, None)
