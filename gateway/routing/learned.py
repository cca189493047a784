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
  and is worth as many observations as the cells' spread around that model allows
  (``learned_prior.strength``, at most ``prior_strength``); the task's own scores update it.
* ``plan``: start every task on its best model (posterior mean), then move tasks to cheaper
  models, the most dollars saved per unit of quality lost first, while a *lower confidence
  bound* of the route's margin over q x the best single model stays above what exploration
  has cost in quality so far (``deficit``, made up by the exploited traffic):
  ``sum_t w_t (q_t(m_t) - q * q_t(m*)) - z * sqrt(sum_t w_t^2 Var(...)) >= need`` (w_t: the
  task's share of the traffic, Var from the Beta posteriors). A move must also keep the task
  above f x its best at the same confidence. The last move that does not fit whole is taken in
  part: that task mixes two targets. The margin shrinks as evidence accumulates, so the rule
  is calibrated by what has been observed rather than a fixed 95% rule.
* ``choose``: after a warm-up (``warmup`` observations per model over the route, and every
  model cheaper than the plan's pick once on each task), explore a model that could still
  change the plan: a cheaper one whose upper bound reaches f x the pick's mean (the most
  promising first; up to 2.5 x ``explore_share`` of the task's requests), or one that could
  be the task's best (up to ``explore_share``); none while the plan's bound is below zero (no
  quality left to spend). Otherwise exploit the plan. Exploration is paid like any request.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gateway.routing.learned_prior import fit, logit, sigmoid, strength

MAX_TASKS: Final = 200  # tasks a learner plans for; further ones share OTHER
OTHER: Final = "(other)"
Z_PLAN: Final = 1.0  # one-sided confidence of the route's margin (about 84%)
Z_EXPLORE: Final = 2.0  # upper bound used to decide whether a model could still matter
PRIOR_LOW, PRIOR_SPAN = 0.45, 0.2  # the price-rank prior: cheapest 0.45 .. dearest 0.65


@dataclass(frozen=True, slots=True)
class LearnSettings:
    quality_target: float = 0.95
    task_floor: float = 0.85
    prior_strength: float = 12.0  # most pseudo-observations the additive prior is worth
    warmup: int = 3  # observations per model over the route before the bound-driven exploration
    explore_share: float = 0.06  # of a task's requests (past two); 2.5x for cheaper candidates
    max_explore_obs: int = 200  # a model needs no more observations on a task than this
    replan_every: int = 8  # observations between two plans (and at every new task)
    z: float = Z_PLAN


@dataclass(slots=True)
class Arm:
    n: float = 0.0  # observations (feedback received)
    s: float = 0.0  # sum of scores
    cost_n: int = 0
    cost_sum: float = 0.0


@dataclass(slots=True)
class TaskState:
    requests: int = 0  # requests decided (served), labelled or not
    explored: int = 0
    arms: dict[str, Arm] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    mean: float
    sd: float
    n: float
    cost: float


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


class Learner:
    """One (tenant, route)'s learner over ``models`` (``price``: a per-request cost guess in
    any unit, e.g. the blended list price; ``ability``: a prior mean score where known)."""

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
        self.prior = _prior_means(self.models, self.price, ability or {})
        self.tasks: dict[str, TaskState] = {}
        self._plan: Plan | None = None
        self._since_plan = 0
        # Exploration's quality shortfall so far (sum over explored requests with feedback of
        # q x the reference's estimate - the score), which exploitation makes up.
        self.deficit = 0.0
        self.explored = 0
        self._fitted: tuple[dict[str, float], dict[str, float]] | None = None
        self._strength = self.settings.prior_strength

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
        ``explore``: the request explored (its shortfall is made up by the plan)."""
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
            if explore and self._plan is not None:
                ref = self.estimate(task, self._plan.best_single).mean
                self.deficit += self.settings.quality_target * ref - min(1.0, max(0.0, score))

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
        k = self._strength
        centre = self._centre(task, model)
        a = centre * k + arm.s
        b = (1.0 - centre) * k + (arm.n - arm.s)
        mean = a / (a + b)
        var = a * b / ((a + b) ** 2 * (a + b + 1.0))
        return Estimate(model, mean, math.sqrt(var), arm.n, self._cost(task, model))

    def _centre(self, task: str, model: str) -> float:
        """The prior mean: the additive model's prediction (``learned_prior``), refitted at
        every plan; before any fit, the catalog prior."""
        if self._fitted is None:
            return self.prior[model]
        a, b = self._fitted
        return sigmoid(a.get(model, logit(self.prior[model])) + b.get(task, 0.0))

    def _refit(self) -> None:
        cells = {(t, m): (arm.n, arm.s) for t, st in self.tasks.items() for m, arm in st.arms.items()}
        self._fitted = fit(cells, self.prior, start=self._fitted)
        a, b = self._fitted
        self._strength = strength(
            cells, lambda t, m: sigmoid(a.get(m, 0.0) + b.get(t, 0.0)), self.settings.prior_strength
        )

    def _pooled(self, model: str) -> tuple[float, float]:
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
            self._refit()
            self._plan = self._make_plan()
            self._since_plan = 0
        return self._plan

    def _make_plan(self) -> Plan:
        s = self.settings
        names = list(self.tasks)
        total = sum(max(1, self.tasks[t].requests) for t in names) or 1
        w = {t: max(1, self.tasks[t].requests) / total for t in names}
        est = {t: {e.model: e for e in self.estimates(t)} for t in names}
        best_single = max(self.models, key=lambda m: sum(w[t] * est[t][m].mean for t in names))
        choice = {t: max(self.models, key=lambda m: (est[t][m].mean, -est[t][m].cost)) for t in names}

        def term(t: str, m: str) -> tuple[float, float]:
            e, ref = est[t][m], est[t][best_single]
            if m == best_single:
                return w[t] * (1 - s.quality_target) * e.mean, (w[t] * (1 - s.quality_target) * e.sd) ** 2
            mean = w[t] * (e.mean - s.quality_target * ref.mean)
            return mean, w[t] ** 2 * (e.sd**2 + (s.quality_target * ref.sd) ** 2)

        def floor_ok(t: str, m: str) -> bool:
            e, top = est[t][m], est[t][choice_best[t]]
            if m == choice_best[t]:
                return True
            return e.mean - s.task_floor * top.mean - s.z * math.hypot(e.sd, s.task_floor * top.sd) >= 0

        choice_best = dict(choice)
        parts = {t: term(t, choice[t]) for t in names}
        mean_sum = sum(p[0] for p in parts.values())
        var_sum = sum(p[1] for p in parts.values())

        requests = sum(self.tasks[t].requests for t in names)
        need = max(0.0, self.deficit / max(1, requests - self.explored))

        def lcb(mean: float, var: float) -> float:
            return mean - need - s.z * math.sqrt(max(var, 0.0))

        mix: dict[str, list[tuple[str, float]]] = {t: [(choice[t], 1.0)] for t in names}
        while True:
            moves = []
            for t in names:
                cur = choice[t]
                for m in self.models:
                    saved = w[t] * (est[t][cur].cost - est[t][m].cost)
                    if saved <= 0 or not floor_ok(t, m):
                        continue
                    new = term(t, m)
                    lost = parts[t][0] - new[0]
                    moves.append((saved / max(lost, 1e-9), t, m, new))
            if not moves:
                break
            moves.sort(key=lambda x: -x[0])
            taken = False
            for _, t, m, new in moves:
                mean = mean_sum - parts[t][0] + new[0]
                var = var_sum - parts[t][1] + new[1]
                if lcb(mean, var) >= 0:
                    mean_sum, var_sum, parts[t], choice[t] = mean, var, new, m
                    mix[t] = [(m, 1.0)]
                    taken = True
                    break
            if not taken:
                _, t, m, new = moves[0]
                dm, dv = new[0] - parts[t][0], new[1] - parts[t][1]
                m0, v0 = mean_sum, var_sum
                f = _part(functools.partial(_shifted, s.z, m0 - need, dm, v0, dv))
                if f > 0.02:
                    mix[t] = [(m, f), (choice[t], 1.0 - f)]
                    mean_sum += f * (new[0] - parts[t][0])
                    var_sum += f * (new[1] - parts[t][1])
                break
        return Plan(mix, best_single, lcb(mean_sum, var_sum))

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
        if explore is not None:
            state.explored += 1
            self.explored += 1
            return Choice(explore[0], True, task, explore[1])
        return Choice(picked, False, task, "plan" if len(plan.mix[task]) == 1 else "mix")

    def _explore(
        self, task: str, state: TaskState, picked: str, warm_only: bool = False
    ) -> tuple[str, str] | None:
        s = self.settings
        cold = [m for m in self.models if self._pooled(m)[0] < s.warmup and m != picked]
        if cold:  # warm-up: every model a few times over the route, the cheapest first
            return min(cold, key=lambda m: (self._pooled(m)[0], self.price[m])), "warm-up"
        # every cheaper model once on each task: the prior alone never writes one off
        unseen = [m for m in self.models if state.arms[m].n < 1 and self.price[m] < self.price[picked]]
        if unseen:
            return min(unseen, key=lambda m: self.price[m]), "warm-up"
        if warm_only:
            return None
        est = {e.model: e for e in self.estimates(task)}
        cur = est[picked]
        top = max(est.values(), key=lambda e: e.mean)
        useful = []
        for m, e in est.items():
            if m == picked or e.n >= s.max_explore_obs:
                continue
            ucb = e.mean + Z_EXPLORE * e.sd
            if e.cost < cur.cost and ucb >= s.task_floor * cur.mean:
                useful.append((0, -(e.mean + e.sd), e.cost, m, "bound"))  # could serve the task for less
            elif ucb > top.mean + Z_EXPLORE * top.sd * 0.5:
                useful.append((1, e.n, e.cost, m, "best"))  # could be the task's best
        if not useful:
            return None
        kind, _, _, m, why = min(useful)
        # A cheaper candidate costs less than the plan's pick: it may take a larger share.
        cap = s.explore_share * (2.5 if kind == 0 else 1.0)
        if state.explored >= 2 + cap * state.requests:
            return None
        return m, why


def _shifted(z: float, mean: float, dmean: float, var: float, dvar: float, f: float) -> float:
    """The route's bound with a share ``f`` of one task moved (mean and variance linear in f)."""
    return mean + f * dmean - z * math.sqrt(max(var + f * dvar, 0.0))


def _part(fn: Callable[[float], float]) -> float:
    """The largest share f in [0, 1] of a task's traffic a move can take with the bound >= 0
    (``fn``: f -> the bound; monotone enough for bisection)."""
    lo, hi = 0.0, 1.0
    if fn(lo) < 0:
        return 0.0
    for _ in range(20):
        mid = (lo + hi) / 2
        if fn(mid) >= 0:
            lo = mid
        else:
            hi = mid
    return lo


def _draw(mix: list[tuple[str, float]], rng: random.Random) -> str:
    if len(mix) == 1:
        return mix[0][0]
    r, acc = rng.random(), 0.0
    for model, share in mix:
        acc += share
        if r < acc:
            return model
    return mix[-1][0]


def _prior_means(
    models: Iterable[str], price: Mapping[str, float], ability: Mapping[str, float]
) -> dict[str, float]:
    """The catalog's ability where it has one, else a guess from the price rank (dearer models
    are a little better on average): 0.45 for the cheapest to 0.65 for the dearest."""
    models = list(models)
    order = sorted(models, key=lambda m: price[m])
    out = {}
    for m in models:
        if m in ability:
            out[m] = min(0.98, max(0.02, float(ability[m])))
        else:
            rank = order.index(m) / max(1, len(order) - 1)
            out[m] = PRIOR_LOW + PRIOR_SPAN * rank
    return out
