"""The learned route's decision rule, pure (no I/O, no clock): per task, which target to serve
next, from the feedback on what was served (bandit feedback: only the served model's outcome is
known), with a prior from the catalog (prices; abilities where known).

The same code runs live (``flow/learning.py`` through ``learned_routes.py``) and offline
(``lab/learned_eval.py``).

Goal (``quality_target`` q, ``task_floor`` f): over the route's traffic, realised quality at
least q x what the best single target would give on that traffic, and every task at least
f x its own best target, at the least cost. The rule:

* Each (task, model) has a Beta posterior over its mean score. Its prior is centred on an
  additive logit model fitted to every cell (``learned_prior.fit``: a model's strength plus a
  task's ease, anchored on the catalog ability where known, else a guess from the price rank)
  and is worth as many observations as the model's cells' spread around it allows
  (``learned_prior.strength``, per model, at most ``prior_strength``); the task's own scores
  update it. The centre's own uncertainty (large while the model has little evidence over the
  route) is added to the spread, in the share the prior still has in the posterior, and it is
  one error for all the model's tasks: route-wide sums add it up before squaring it.
* ``plan``: every task starts on its best model and walks down its *frontier* (the upper
  convex hull of (cost, value), a model valued at ``mean - Z_PICK x sd``: the models the plan
  picks are the ones whose means came out high); the step saving the most dollars per unit of
  quality over all tasks goes first, as far as a *lower confidence bound* of the route's margin
  over q x the best single model allows: ``sum_t w_t (mix_t - q * q_t(m*)) - z * sd >= need``
  (w_t: the task's share of the traffic, sd from the posteriors), and as far as the task's mix
  stays above f x its best at the same confidence (a task may mix a model below the floor with
  a better one). A step that does not fit whole is taken in part (the task mixes two
  neighbours). ``need`` is the route's realised bank: what the served requests scored beyond
  q x an upper bound (``Z_BAR``) of the best single model on the same tasks (exploration's
  shortfall and exploitation's luck both), owed back over a future half as long as the past.
* ``choose`` (exploration: ``learned_explore.py``): after a warm-up (``warmup`` observations
  per model over the route, and every model cheaper than the plan's pick whose upper bound
  reaches the floor once on each task), explore a model that could still change the plan: a
  cheaper one whose upper bound reaches f x the pick's mean (the most promising first; up to
  2.5 x ``explore_share`` of the task's requests), or one that could be the task's best (up to
  ``explore_share``); none while the plan's bound is below zero (no quality left to spend).
  Else, on ``reference_share`` of requests, serve the model with the highest upper bound of
  the route-wide mean (the contender for best single model: the bar the route is held to must
  be measured, not assumed). Otherwise exploit the plan. Exploration is paid like any request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.routing.learned_explore import Z_EXPLORE, explore
from gateway.routing.learned_frontier import Part, Totals
from gateway.routing.learned_frontier import frontier as _frontier
from gateway.routing.learned_frontier import part as _part
from gateway.routing.learned_prior import fit, logit, prior_means, sigmoid, strength
from gateway.routing.learned_state import Arm, Estimate, LearnSettings, TaskState

__all__ = ["Arm", "Choice", "Estimate", "LearnSettings", "Learner", "Plan", "TaskState"]

MAX_TASKS: Final = 200  # tasks a learner plans for; further ones share OTHER
OTHER: Final = "(other)"
Z_BAR: Final = 1.0  # the bank's bar: the best single model's upper bound, not its mean
BANK_HORIZON: Final = 0.5  # the bank is owed back over a future this share of the past
REFIT_GROWTH: Final = 0.05  # the evidence's growth that triggers a refit of the prior
Z_PICK: Final = 0.25  # the plan values a model it would serve at mean - Z_PICK x sd
CENTRE_N: Final = 2.0  # what a model's route-wide centre is worth before it has evidence


@dataclass(frozen=True, slots=True)
class Choice:
    model: str
    explore: bool
    task: str
    why: str  # "plan", "mix", "warm-up", "bound", "best"


@dataclass(slots=True)
class Plan:
    mix: dict[str, list[tuple[str, float]]]  # task -> [(model, share)]
    best_single: str
    lcb_margin: float  # the route's margin's lower bound at the plan
    contender: str = ""  # the model with the highest upper bound of the route's mean
    rate: float = 0.0  # dollars saved per unit of quality of the step the margin stopped (0: none)


class Learner:
    """One (tenant, route)'s learner over ``models`` (``price``: a per-request cost guess in
    any unit, e.g. the blended list price; ``ability``: a prior mean score where known)."""

    z_pick = Z_PICK  # class attributes: the evaluation's design variants change them
    z_bar = Z_BAR

    def __init__(
        self,
        models: Sequence[str],
        price: Mapping[str, float],
        ability: Mapping[str, float] | None = None,
        settings: LearnSettings | None = None,
    ) -> None:
        if not models:
            raise ValueError("a learned route needs at least one target")
        self.models = tuple(models)
        self.settings = settings or LearnSettings()
        self.price = {m: max(float(price.get(m, 1.0)), 1e-12) for m in self.models}
        self.prior = prior_means(self.models, self.price, ability or {})
        self.tasks: dict[str, TaskState] = {}
        self._plan: Plan | None = None
        self._since_plan = 0
        self.explored = 0
        self._fitted: tuple[dict[str, float], dict[str, float]] | None = None
        self._pooled_n: dict[str, float] | None = None  # per model, while a plan is made
        self._strength = self.settings.prior_strength
        self._strengths: dict[str, float] = {}
        self._fit_seen = 0.0  # observations at the last refit

    # -- evidence ----------------------------------------------------------------------
    def name(self, task: str) -> str:
        """The task's own name, or ``OTHER`` once the learner holds ``MAX_TASKS`` tasks (a
        system prompt that changes every request must not grow the plan without bound)."""
        return task if task in self.tasks or len(self.tasks) < MAX_TASKS else OTHER

    def task(self, name: str) -> TaskState:
        name = self.name(name)
        state = self.tasks.get(name)
        if state is None:
            state = self.tasks[name] = TaskState(arms={m: Arm() for m in self.models})
            self._plan = None
        return state

    def observe(
        self,
        task: str,
        model: str,
        score: float | None = None,
        cost: float | None = None,
        explore: bool = False,
    ) -> None:
        """A served request's outcome (``score`` in [0, 1], None: no feedback yet) and cost;
        ``explore``: the request explored (kept for the callers; every served outcome counts
        in the route's realised bank alike, see ``_need``)."""
        task = self.name(task)
        arm = self.task(task).arms.get(model)
        if arm is None:
            return  # a model the route no longer has
        if cost is not None:
            arm.cost_n += 1
            arm.cost_sum += cost
        if score is not None:
            arm.n += 1.0
            arm.s += min(1.0, max(0.0, score))
            self._since_plan += 1

    def load(self, task: str, model: str, n: float, total: float, requests: int = 0) -> None:
        """Set a (task, model)'s evidence from the database (a rebuild or a replica's sync)."""
        task = self.name(task)
        state = self.task(task)
        arm = state.arms.get(model)
        if arm is not None:
            arm.n, arm.s = float(n), float(total)
        state.requests = max(state.requests, requests)
        self._plan = None

    # -- estimates ---------------------------------------------------------------------
    def estimate(self, task: str, model: str) -> Estimate:
        """The Beta posterior of ``model`` on ``task``: its prior is the model's record over
        every task (itself starting from the catalog prior), so a new task starts from what
        the model did elsewhere and a task's own evidence takes over as it accumulates."""
        task = self.name(task)
        arm = self.task(task).arms[model]
        k = self._strengths.get(model, self._strength)
        centre = self._centre(task, model)
        a = centre * k + arm.s
        b = (1.0 - centre) * k + (arm.n - arm.s)
        mean = a / (a + b)
        var = a * b / ((a + b) ** 2 * (a + b + 1.0))
        # The centre itself is uncertain while the model has little evidence over the route,
        # and that uncertainty is shared by every task: its share of the posterior's mean.
        pooled = self._pooled_n.get(model, 0.0) if self._pooled_n is not None else self.pooled(model)[0]
        shared = (k / (k + arm.n)) ** 2 * centre * (1.0 - centre) / (pooled + CENTRE_N)
        return Estimate(
            model, mean, math.sqrt(var + shared), arm.n, self._cost(task, model), math.sqrt(shared)
        )

    def _centre(self, task: str, model: str) -> float:
        """The prior mean: the additive model's prediction (``learned_prior``), refitted at
        every plan; before any fit, the catalog prior."""
        if self._fitted is None:
            return self.prior[model]
        a, b = self._fitted
        return sigmoid(a.get(model, logit(self.prior[model])) + b.get(task, 0.0))

    def _refit(self) -> None:
        cells = {(t, m): (arm.n, arm.s) for t, st in self.tasks.items() for m, arm in st.arms.items()}
        self._fitted = fit(cells, self.prior, sweeps=8 if self._fitted is None else 3, start=self._fitted)
        a, b = self._fitted
        self._strength, self._strengths = strength(
            cells, lambda t, m: sigmoid(a.get(m, 0.0) + b.get(t, 0.0)), self.settings.prior_strength
        )

    def pooled(self, model: str) -> tuple[float, float]:
        """The model's evidence over the route: observations and the sum of their scores."""
        n = s = 0.0
        for state in self.tasks.values():
            arm = state.arms.get(model)
            if arm is not None:
                n += arm.n
                s += arm.s
        return n, s

    def _cost(self, task: str, model: str) -> float:
        state = self.task(task)
        arm = state.arms[model]
        if arm.cost_n >= 3:
            return arm.cost_sum / arm.cost_n
        seen = [(a.cost_sum, a.cost_n * self.price[m]) for m, a in state.arms.items() if a.cost_n]
        scale = sum(c for c, _ in seen) / sum(p for _, p in seen) if seen else 1.0
        return scale * self.price[model]

    def estimates(self, task: str) -> list[Estimate]:
        return [self.estimate(task, m) for m in self.models]

    # -- the plan ----------------------------------------------------------------------
    def plan(self) -> Plan:
        if self._plan is None or self._since_plan >= self.settings.replan_every:
            self._pooled_n = {m: self.pooled(m)[0] for m in self.models}
            seen = sum(self._pooled_n.values())
            # the prior is refitted once the evidence has grown by REFIT_GROWTH (or tasks came):
            # it moves little between two plans, and the fit is most of a plan's time
            stale = self._fitted is None or len(self._fitted[1]) != len(self.tasks)
            if stale or seen >= self._fit_seen * (1 + REFIT_GROWTH):
                self._refit()
                self._fit_seen = seen
            try:
                self._plan = self._make_plan()
            finally:
                self._pooled_n = None
            self._since_plan = 0
        return self._plan

    def _make_plan(self) -> Plan:
        s = self.settings
        names = list(self.tasks)
        total = sum(max(1, self.tasks[t].requests) for t in names) or 1
        w = {t: max(1, self.tasks[t].requests) / total for t in names}
        est = {t: {e.model: e for e in self.estimates(t)} for t in names}
        single = {m: sum(w[t] * est[t][m].mean for t in names) for m in self.models}
        best_single = max(self.models, key=lambda m: single[m])
        spread = {m: _route_sd([(w[t], est[t][m]) for t in names]) for m in self.models}
        # the model that could most be the best single one (upper bound): the bar's sample
        contender = max(self.models, key=lambda m: (single[m] + Z_EXPLORE * spread[m], -self.price[m]))
        need = self._need(est, best_single)
        # what a model would serve, planned on a lower bound (the plan picks the cheap models that
        # look good: their posterior means are the optimistic ones); the bar on its mean
        low = {t: {m: _shift(e, -self.z_pick) for m, e in est[t].items()} for t in names}
        hulls = {t: _frontier(list(low[t].values())) for t in names}

        def margin(t: str, a: Estimate, b: Estimate, f: float) -> Part:
            """Task t's term of the route's margin with a share f moved a -> b: its mean, its
            variance of the task's own, and per model its part of the shared (centre) spread."""
            coef = {a.model: 1.0 - f}
            coef[b.model] = coef.get(b.model, 0.0) + f
            coef[best_single] = coef.get(best_single, 0.0) - s.quality_target
            e = est[t]
            lo = low[t]
            mean = w[t] * (
                (1 - f) * lo[a.model].mean + f * lo[b.model].mean - s.quality_target * e[best_single].mean
            )
            var = w[t] ** 2 * sum(c * c * (e[m].sd ** 2 - e[m].shared ** 2) for m, c in coef.items())
            return mean, var, {m: w[t] * c * e[m].shared for m, c in coef.items()}

        def floor_ok(t: str, a: Estimate, b: Estimate, f: float) -> bool:
            top = hulls[t][0]
            mean = (1 - f) * a.mean + f * b.mean - s.task_floor * top.mean
            if a.model == top.model:
                var = (((1 - f) - s.task_floor) * a.sd) ** 2 + (f * b.sd) ** 2
            else:
                var = ((1 - f) * a.sd) ** 2 + (f * b.sd) ** 2 + (s.task_floor * top.sd) ** 2
            return mean - s.z * math.sqrt(var) >= 0

        pos = dict.fromkeys(names, 0)
        parts = {t: margin(t, hulls[t][0], hulls[t][0], 0.0) for t in names}
        route = Totals(need, s.z)
        for p in parts.values():
            route.add(p, 1.0)

        mix: dict[str, list[tuple[str, float]]] = {t: [(hulls[t][0].model, 1.0)] for t in names}
        rate = 0.0
        open_ = set(names)
        while open_:
            # the next step on each task's frontier; the most dollars saved per quality lost first
            steps = []
            for t in open_:
                if pos[t] + 1 >= len(hulls[t]):
                    continue
                a, b = hulls[t][pos[t]], hulls[t][pos[t] + 1]
                steps.append(((a.cost - b.cost) / max(a.mean - b.mean, 1e-9), t))
            if not steps:
                break
            _, t = max(steps)
            a, b = hulls[t][pos[t]], hulls[t][pos[t] + 1]
            old = parts[t]

            def fits(f: float, t: str = t, a: Estimate = a, b: Estimate = b, old: Part = old) -> float:
                """The route's bound with a share f of task t moved a -> b (-1: below floor)."""
                return route.lcb_with(old, margin(t, a, b, f)) if floor_ok(t, a, b, f) else -1.0

            whole_route = route.lcb_with(old, margin(t, a, b, 1.0)) >= 0
            f = 1.0 if whole_route and floor_ok(t, a, b, 1.0) else _part(fits)
            if f > 0.02:
                new = margin(t, a, b, f)
                route.add(old, -1.0)
                route.add(new, 1.0)
                parts[t] = new
                mix[t] = [(b.model, 1.0)] if f == 1.0 else [(b.model, f), (a.model, 1.0 - f)]
            if f == 1.0:
                pos[t] += 1
                parts[t] = margin(t, b, b, 0.0)  # the same term, rebased on b
            elif not whole_route:
                rate = (a.cost - b.cost) / max(a.mean - b.mean, 1e-9)
                break  # the route's margin is spent
            else:
                open_.discard(t)  # the task's floor stops it here
        return Plan(mix, best_single, route.lcb(), contender, rate)

    def _need(self, est: Mapping[str, Mapping[str, Estimate]], best_single: str) -> float:
        """The margin per request the plan must add so that the route makes up for what its
        served requests fell short of q x the best single model (exploration's shortfall
        and exploitation's luck, both), over a future as long as the past."""
        s = self.settings
        names = list(est)
        n_t, got = self._served(names)
        rated = sum(n_t.values())
        bar = sum(n_t[t] * est[t][best_single].mean for t in names)
        sd = _route_sd([(n_t[t], est[t][best_single]) for t in names])
        bank = got - s.quality_target * (bar + self.z_bar * sd)
        return -bank / max(1.0, BANK_HORIZON * rated)

    def _served(self, names: Sequence[str]) -> tuple[dict[str, float], float]:
        """The rated requests served per task, and the sum of their scores (the evidence is
        what was served: only the served model's outcome is known)."""
        n_t = {t: sum(a.n for a in self.tasks[t].arms.values()) for t in names}
        return n_t, sum(a.s for t in names for a in self.tasks[t].arms.values())

    # -- the decision ------------------------------------------------------------------
    def choose(self, task: str, rng: random.Random) -> Choice:
        task = self.name(task)
        state = self.task(task)
        state.requests += 1
        plan = self.plan()
        if task not in plan.mix:
            self._plan = None
            plan = self.plan()
        picked = _draw(plan.mix[task], rng)
        # No quality left to spend (the plan's bound is below zero): exploit only.
        explore = self._explore(task, state, picked, warm_only=plan.lcb_margin < 0)
        if (
            explore is None
            and rng.random() < self.settings.reference_share
            and plan.contender not in ("", picked)
        ):
            explore = plan.contender, "reference"
        if explore is not None:
            state.explored += 1
            self.explored += 1
            return Choice(explore[0], True, task, explore[1])
        return Choice(picked, False, task, "plan" if len(plan.mix[task]) == 1 else "mix")

    def _explore(
        self, task: str, state: TaskState, picked: str, warm_only: bool = False
    ) -> tuple[str, str] | None:
        return explore(self, task, state, picked, warm_only)


def _route_sd(terms: Sequence[tuple[float, Estimate]]) -> float:
    """The spread of a weighted sum of one model's estimates over tasks: the tasks' own parts
    add in variance, the shared centre's part adds up first."""
    own = sum((w * (e.sd**2 - e.shared**2) ** 0.5) ** 2 for w, e in terms)
    shared = sum(w * e.shared for w, e in terms)
    return math.sqrt(own + shared * shared)


def _shift(e: Estimate, k: float) -> Estimate:
    return Estimate(e.model, e.mean + k * e.sd, e.sd, e.n, e.cost, e.shared)


def _draw(mix: list[tuple[str, float]], rng: random.Random) -> str:
    if len(mix) == 1:
        return mix[0][0]
    r, acc = rng.random(), 0.0
    for model, share in mix:
        acc += share
        if r < acc:
            return model
    return mix[-1][0]
