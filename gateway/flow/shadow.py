"""Shadow evaluation (route ``shadow:``): for a sampled share of a route's answered requests,
in the background after the answer, the same request goes to a stronger ``candidate``, and the
served answer is judged by programmatic checks (``verify``, routing/verify.py: it passes them
and its final answer agrees with the candidate's) or by a ``judge`` model comparing it with the
candidate's; the score is stored as the request's
feedback (source ``shadow``) and teaches the route's learner. Every shadow call (candidate,
judge) is a ledger row (``<request id>-shadow``, ``-judge``; ``route_decision`` ``shadow`` /
``shadow:judge``; baseline 0). Sampling stops while the shadow calls' cost exceeds
``max_spend_share`` of what the route's served answers cost (per process)."""

from __future__ import annotations

import logging
import re
from decimal import Decimal
from typing import Any, Final

from gateway.core.errors import SwitchyardError
from gateway.core.types import Principal
from gateway.flow.adapters.base import Answer, Inbound
from gateway.flow.exchange import Exchange
from gateway.flow.extra_rows import extra, settle
from gateway.flow.metering import priced
from gateway.flow.services import Services
from gateway.flow.upstream import attempt, metered
from gateway.routing.plan import RoutePlan
from gateway.routing.verify import answer_text, check, final_answer

log = logging.getLogger("switchyard")
_SCORE: Final = re.compile(r"(?<![\d.])(0(?:\.\d+)?|1(?:\.0+)?)(?![\d.])")
JUDGE_SYSTEM: Final = (  # after the request and the answers, in the one user message
    "You grade an answer to a request. Above are the request, the answer to grade (A) and a "
    "reference answer from a stronger model (B). Reply with one number from 0 to 1: how good A "
    "is as an answer to the request (1: as good as B or better; 0: wrong or useless). Reply with "
    "the number only."
)


def maybe(svc: Services, plan: RoutePlan, inbound: Inbound, ex: Exchange, answer: Answer) -> None:
    """Called once a non-streamed answer is metered: sample it for a shadow evaluation."""
    cfg = plan.policy.shadow
    if cfg is None or ex.target is None or answer.completion is None:
        return
    svc.shadow_spend.add_served(plan.name, priced(ex.usage, ex.target.price, True) or Decimal(0))
    if ex.target.model == cfg.candidate:
        return
    if not svc.shadow_spend.sample(plan.name, cfg.share, cfg.max_spend_share, cfg.seed):
        return
    svc.tasks.spawn(_run(svc, plan, inbound.record.body, ex, answer.completion))


async def _run(
    svc: Services, plan: RoutePlan, body: dict[str, Any], ex: Exchange, served: dict[str, Any]
) -> None:
    cfg = plan.policy.shadow
    assert cfg is not None
    try:
        reference = await _call(svc, plan, ex, cfg.candidate, body, "shadow", "shadow")
        if reference is None:
            return
        if cfg.verify:  # the served answer passes the checks and agrees with the candidate's
            mine, theirs = final_answer(answer_text(served)), final_answer(answer_text(reference))
            agrees = mine is None or theirs is None or abs(mine - theirs) < 1e-6
            score = 1.0 if check(cfg.verify, served, body) is None and agrees else 0.0
        else:
            assert cfg.judge is not None
            asked = _judge_body(body, served, reference)
            graded = await _call(svc, plan, ex, cfg.judge, asked, "judge", "shadow:judge")
            if graded is None:
                return
            found = _SCORE.search(answer_text(graded))
            if found is None:
                log.warning("shadow judge gave no score for %s", ex.request_id)
                return
            score = float(found.group(1))
        if svc.feedback is not None:
            owner = await svc.feedback.submit(ex.principal.tenant, ex.request_id, score, "shadow")
            if owner is not None and owner.route and owner.task and owner.model:
                svc.learned.observe(owner.route, ex.principal.tenant, owner.task, owner.model, score)
    except Exception:  # a background evaluation never fails a request
        log.exception("shadow evaluation of %s failed", ex.request_id)


async def _call(
    svc: Services, plan: RoutePlan, ex: Exchange, model: str, body: dict[str, Any], suffix: str, decision: str
) -> dict[str, Any] | None:
    """One shadow call to ``model``, its own ledger row; the completion, or None on an error."""
    target_plan = svc.router.resolve(model, Principal(ex.principal.tenant, ex.principal.key_id), "chat")
    x = extra(ex, suffix, decision, plan)
    try:
        got = await attempt(svc, target_plan, x, _chat_call(body))
    except SwitchyardError as exc:
        x.status, x.http_status, x.error_code = "error", exc.status, exc.code
        await settle(svc, x, body)
        return None
    x.usage = metered(svc, body, got.completion, x, got.usage)
    if x.target is not None:
        svc.shadow_spend.add_shadow(plan.name, priced(x.usage, x.target.price, True) or Decimal(0))
    await settle(svc, x, body)
    completion: dict[str, Any] | None = got.completion
    return completion


def _chat_call(body: dict[str, Any]) -> Any:
    async def call(provider: Any, target: Any, timeout: float) -> Answer:
        result = await provider.chat({**body, "stream": False}, target, timeout)
        return Answer(result.usage, completion=result.body)

    return call


def _judge_body(body: dict[str, Any], served: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    question = "\n".join(
        f"{m.get('role')}: {m.get('content')}" for m in body.get("messages") or () if isinstance(m, dict)
    )
    answer, ref = answer_text(served), answer_text(reference)
    user = f"Request:\n{question}\n\nAnswer A:\n{answer}\n\nAnswer B (reference):\n{ref}"
    return {
        "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 8,
    }
