"""A verifier cascade (route ``cascade:``): the route's first target answers; its answer is
checked (gateway/routing/verify.py, plus the route's plug-in); a failed check escalates to the
route's other targets (in order, with their fallbacks). With ``escalate_share`` the ``math``
check is graded (routing/verify_score.py): the answer escalates when its suspicion score ranks
in the top share of the route's recent scores (a calibrator per route and process: no labels);
with ``escalate_above``, when it scores above that. With ``second_sample``, an answer that
passes is sampled again from the first target (its own ledger row, ``<request id>-2``,
``cascade:sample``, baseline 0) and escalates when the two final answers differ.
Non-streamed requests only: a stream is served by the route as usual and says
``x-switchyard-cascade: declined-stream``.

Both attempts are ledger rows: the escalated cheap attempt as ``<request id>-1`` with
``route_decision = cascade:escalated`` and a baseline of 0 (it saved nothing, its whole cost is
extra, so the savings reports subtract it), its cost settled on the budgets; the answer the
client gets carries the request id, ``cascade:strong`` and the route's baseline. An accepted
cheap answer is one row, ``cascade:accepted``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from gateway.config.route_extras import CascadePolicy
from gateway.core.errors import SwitchyardError
from gateway.core.types import Usage
from gateway.flow.adapters.base import Answer, Inbound
from gateway.flow.exchange import Exchange
from gateway.flow.extra_rows import extra, settle
from gateway.flow.services import Services
from gateway.flow.upstream import attempt, metered
from gateway.routing.plan import RoutePlan
from gateway.routing.verify import answer_text, plugin
from gateway.routing.verify_score import Grading, ShareCalibrator, disagreement, verdict

log = logging.getLogger("switchyard")
_calibrators: dict[tuple[str, float], ShareCalibrator] = {}  # (route, share): recent scores


def _grading(route: str, cfg: CascadePolicy) -> Grading | None:
    if cfg.escalate_share is not None:
        key = (route, cfg.escalate_share)
        cal = _calibrators.get(key)
        if cal is None:
            cal = _calibrators[key] = ShareCalibrator(cfg.escalate_share)
        return Grading(calibrator=cal)
    if cfg.escalate_above is not None:
        return Grading(above=cfg.escalate_above)
    return None


def declined(plan: RoutePlan, ex: Exchange) -> None:
    """A stream on a cascade route: served as usual, said so."""
    if plan.policy.cascade is not None:
        ex.cascade = "declined-stream"


async def answer(svc: Services, plan: RoutePlan, ex: Exchange, inbound: Inbound) -> Answer:
    cfg = plan.policy.cascade
    if cfg is None or len(plan.targets) < 2:
        return await attempt(svc, plan, ex, inbound.call)
    cheap = dataclasses.replace(plan, targets=plan.targets[:1])
    got: Answer | None
    try:
        got = await attempt(svc, cheap, ex, inbound.call)
    except SwitchyardError:
        why: str | None = "the first target failed"
        got = None
    else:
        why = _verdict(cfg.verify, cfg.check, got, inbound.record.body, _grading(plan.name, cfg))
        if why is None and cfg.second_sample:
            why = await _second_sample(svc, cheap, ex, inbound, got)
    if why is None and got is not None:
        ex.cascade, ex.route_decision = "accepted", "cascade:accepted"
        return got
    if got is not None:
        await _escalated_row(svc, ex, got, inbound)
    else:  # the cheap target failed before answering: nothing was spent, nothing to record
        ex.attempts, ex.upstream_seconds, ex.target = 0, 0.0, None
    ex.cascade, ex.route_decision = "escalated", "cascade:strong"
    log.debug("cascade %s escalated: %s", ex.request_id, why)
    return await attempt(svc, dataclasses.replace(plan, targets=plan.targets[1:]), ex, inbound.call)


def _verdict(
    names: Sequence[str], spec: str | None, got: Answer, body: dict[str, object], grading: Grading | None
) -> str | None:
    completion = got.completion
    if completion is None:  # a native answer in another protocol: the checks read chat
        return None
    why = verdict(names, completion, body, grading) if names else None
    if why is None and spec is not None:
        try:
            why = plugin(spec)(completion, body)
        except Exception:  # a broken plug-in escalates rather than serving an unchecked answer
            log.exception("cascade check %s failed", spec)
            why = "the check plug-in failed"
    return why


async def _second_sample(
    svc: Services, cheap: RoutePlan, ex: Exchange, inbound: Inbound, got: Answer
) -> str | None:
    """Sample the first target again (its own row, all extra cost) and compare final answers.
    A failed second call leaves the first answer standing (it passed its checks)."""
    if got.completion is None:
        return None
    x = extra(ex, "2", "cascade:sample")
    try:
        other = await attempt(svc, cheap, x, inbound.call)
    except SwitchyardError:
        return None
    x.usage = metered(svc, inbound.record.body, other.completion, x, other.usage)
    await settle(svc, x, inbound.record.body)
    if other.completion is None:
        return None
    return disagreement(answer_text(got.completion), answer_text(other.completion))


async def _escalated_row(svc: Services, ex: Exchange, got: Answer, inbound: Inbound) -> None:
    """The cheap attempt's own ledger row (and its cost on the budgets); the exchange is reset
    for the escalation."""
    first = extra(ex, "1", "cascade:escalated")
    first.target, first.attempts, first.upstream_seconds = ex.target, ex.attempts, ex.upstream_seconds
    first.cascade = "escalated"
    first.usage = metered(svc, inbound.record.body, got.completion, first, got.usage)
    await settle(svc, first, inbound.record.body)
    ex.attempts, ex.upstream_seconds, ex.target, ex.usage = 0, 0.0, None, Usage()
