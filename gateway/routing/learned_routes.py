"""The live state of the learned routes: one ``learned.Learner`` per (route, tenant), built
from the route's targets (blended list price; the model's ``mmlu_pro`` accuracy as the prior
where the policy gives one), fed by feedback as it arrives and re-read from the shared
database (``load``) at start and every ``learn.sync_s`` (so a restart or another replica sees
the same evidence). No I/O here: the flow reads the database through core.ports.Feedback."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gateway.config.policy import Policy
from gateway.config.route_extras import LearnPolicy
from gateway.core.ports import FeedbackOutcome
from gateway.core.types import Target
from gateway.routing.learned import Choice, Estimate, Learner, LearnSettings
from gateway.routing.plan import RoutePlan

SNAPSHOT_COLUMNS = ("route", "tenant", "task", "requests", "explored", "plan", "best_single", "bound")


@dataclass(frozen=True, slots=True)
class Decision:
    plan: RoutePlan  # the chosen target first, the others after it in the route's order
    choice: Choice

    @property
    def label(self) -> str:
        """The ledger's ``route_decision``: ``explore:<task>`` or ``exploit:<task>``."""
        return f"{'explore' if self.choice.explore else 'exploit'}:{self.choice.task}"


def settings_of(learn: LearnPolicy) -> LearnSettings:
    """The rule's settings from the policy; an exploration share the policy does not set is the
    rule's own default (``LearnSettings.explore_share``, the one the evaluation measured)."""
    settings = LearnSettings(
        quality_target=learn.quality_target,
        task_floor=learn.task_floor,
        prior_strength=learn.prior_strength,
    )
    if "explore_share" in learn.model_fields_set:
        settings = replace(settings, explore_share=learn.explore_share)
    return settings


def blended_price(target: Target) -> float:
    """USD per 1M tokens, input and output averaged: the learner's per-request cost guess."""
    return float((target.price.input + target.price.output) / 2)


class LearnedRoutes:
    """Every learned route's learners, across policy reloads (a learner is rebuilt when its
    route's targets or settings change)."""

    def __init__(self) -> None:
        self._learners: dict[tuple[str, str], tuple[tuple[str, ...], LearnSettings, Learner]] = {}
        self._rng: dict[str, random.Random] = {}
        self._lock = threading.Lock()

    def learner(self, plan: RoutePlan, tenant: str, ability: Mapping[str, float] | None = None) -> Learner:
        learn = plan.policy.learn
        assert learn is not None
        models = tuple(dict.fromkeys(t.model for t in plan.targets))
        settings = settings_of(learn)
        key = (plan.name, tenant)
        found = self._learners.get(key)
        if found is not None and found[0] == models and found[1] == settings:
            return found[2]
        price = {t.model: blended_price(t) for t in plan.targets}
        learner = Learner(models, price, ability, settings)
        with self._lock:
            self._learners[key] = (models, settings, learner)
        return learner

    def decide(
        self, plan: RoutePlan, tenant: str, task: str, ability: Mapping[str, float] | None = None
    ) -> Decision:
        learner = self.learner(plan, tenant, ability)
        learn = plan.policy.learn
        rng = self._rng.get(plan.name)
        if rng is None:
            rng = self._rng[plan.name] = random.Random(learn.seed if learn is not None else None)
        choice = learner.choose(task, rng)
        first = [t for t in plan.targets if t.model == choice.model]
        rest = [t for t in plan.targets if t.model != choice.model]
        return Decision(replace(plan, targets=(*first, *rest)), choice)

    def observe(
        self, route: str, tenant: str, task: str, model: str, score: float, explore: bool = False
    ) -> None:
        found = self._learners.get((route, tenant))
        if found is not None:
            found[2].observe(task, model, score, explore=explore)

    def load(
        self,
        plan: RoutePlan,
        outcomes: Iterable[FeedbackOutcome],
        requests: Mapping[tuple[str, str], int],
        ability: Mapping[str, float] | None = None,
        explored: Mapping[tuple[str, str], int] | None = None,
    ) -> int:
        """Replace a route's evidence by the database's (every tenant); returns the learners.
        ``explored``: the requests per (tenant, task) that explored, every process's (the
        exploration allowance is the route's: a restart or another replica does not renew it)."""
        tenants: set[str] = {t for t, _ in requests}
        rows = list(outcomes)
        tenants.update(o.tenant for o in rows)
        for tenant in tenants:
            learner = self.learner(plan, tenant, ability)
            for (who, task), n in requests.items():
                if who == tenant:
                    learner.task(task).requests = max(learner.task(task).requests, n)
            for (who, task), n in (explored or {}).items():
                if who == tenant:
                    learner.task(task).explored = max(learner.task(task).explored, n)
            for o in rows:
                if o.tenant == tenant:
                    learner.load(o.task, o.model, o.n, o.total)
        return len(tenants)

    def snapshot(self, route: str | None = None, tenant: str | None = None) -> list[dict[str, object]]:
        """What this process's learners do now, a row per (route, tenant, task): its requests
        and explorations, the plan's target(s) with their shares, and the route's best single
        model and bound (the lower bound of its margin over the quality target, < 0: no quality
        left to spend). Replicas agree up to ``learn.sync_s``. Call it on the event loop (it
        may replan, as a request would)."""
        with self._lock:
            learners = sorted(self._learners.items())
        rows: list[dict[str, object]] = []
        for (name, who), (_, _, learner) in learners:
            if (route and name != route) or (tenant and who != tenant) or not learner.tasks:
                continue
            plan = learner.plan()  # a new task resets the plan: it covers every task
            for task, state in sorted(learner.tasks.items()):
                rows.append(
                    {
                        "route": name,
                        "tenant": who,
                        "task": task,
                        "requests": state.requests,
                        "explored": state.explored,
                        "plan": " + ".join(f"{m} {share:.2f}" for m, share in _by_share(plan.mix[task])),
                        "best_single": plan.best_single,
                        "bound": round(plan.lcb_margin, 4),
                    }
                )
        return rows

    def estimates(self, plan: RoutePlan, tenant: str, task: str) -> tuple[list[Estimate], Learner]:
        learner = self.learner(plan, tenant)
        return learner.estimates(task), learner


def _by_share(mix: list[tuple[str, float]]) -> list[tuple[str, float]]:
    return sorted(mix, key=lambda part: -part[1])


def learned_routes(policy: Policy) -> list[str]:
    """The names of the policy's learned routes."""
    return [name for name, route in policy.routes.items() if route.learn is not None]


def abilities(policy: Policy) -> dict[str, float]:
    """The prior mean score per model where the policy gives its public MMLU-Pro accuracy."""
    return {name: m.mmlu_pro for name, m in policy.models.items() if m.mmlu_pro is not None}
