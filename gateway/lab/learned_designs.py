"""The learned route's design variants measured against the shipped rule (`switchyard eval
routing --design NAME`; docs/learned-routing.md, "Later designs"): each a subclass of
``routing.learned.Learner`` changing one thing, or a hook the replay calls after each request.
None of them ships: every one that spends less gave up quality in proportion.

- ``screen``: every model cheaper than the pick whose upper bound reaches the pick's mean is
  tried up to 8 times on each task, no share cap (``-pick-0.5`` / ``-0.75``: picks valued at
  mean - 0.5 / 0.75 sd);
- ``xrate``: screening at the plan's exchange rate: a cheaper model is tried (up to 30 times)
  while its upper bound reaches the mean at which it would replace the pick;
- ``best-5`` / ``best-10``: "could be the task's best" tried up to 30 times among models no
  dearer than the task's best, within 5% / 10% of the task's requests;
- ``lagrangian-ts``: per request a draw from each posterior, serve argmax lambda x draw - cost
  (cost over the task's dearest), lambda = 5 e^(0.1 x the bank's shortfall);
- ``sampled-plans``: the planner on one posterior draw per replan (``-z0``: at z = 0, picks at
  their mean);
- ``prior-2`` / ``-4`` / ``-8``: the prior worth at most that many observations
  (``prior-2-explore-0.04`` / ``-0.08``: with that explore_share);
- ``loo-strength``: the prior's strength from leave-one-out residuals;
- ``bar-mean`` / ``bar-0.5``: the bank's bar at the best single model's mean / + 0.5 sd;
- ``bar-served``: the bank counts the bar model's own served outcomes as observed;
- ``contender-40`` / ``-80``: the contender for best single model served (20% of requests)
  until it has 40 / 80 observations;
- ``probes-true`` / ``-zero`` / ``-skip``: a share of requests also goes, in the background, to
  the most promising cheaper candidate (paid, never served); its outcome is revealed as is
  (``true``), or as agreement with the served answer's rating would give it: right when the
  served answer is right, else 0 (``zero``) or unknown (``skip``)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.routing.learned import Choice, Estimate, Learner, LearnSettings, Plan, _route_sd
from gateway.routing.learned_explore import Z_EXPLORE
from gateway.routing.learned_prior import MODEL_CELLS, sigmoid

# after(learner, task, served model, its score, the row's scores and costs) -> extra cost
After = Callable[[Learner, str, str, float, Mapping[str, float], Mapping[str, float]], float]


@dataclass(frozen=True, slots=True)
class Design:
    learner: type[Learner] = Learner
    settings: Mapping[str, Any] = field(default_factory=dict)  # LearnSettings overrides
    after: After | None = None

    def apply(self, settings: LearnSettings) -> LearnSettings:
        return replace(settings, **self.settings) if self.settings else settings


def _screen(n: int, z_pick: float) -> type[Learner]:
    class Screen(Learner):
        def _explore(
            self, task: str, state: Any, picked: str, warm_only: bool = False
        ) -> tuple[str, str] | None:
            s = self.settings
            cold = [m for m in self.models if self.pooled(m)[0] < s.warmup and m != picked]
            if cold:
                return min(cold, key=lambda m: (self.pooled(m)[0], self.price[m])), "warm-up"
            est = {e.model: e for e in self.estimates(task)}
            cur = est[picked]
            cands = [
                (-(e.mean + Z_EXPLORE * e.sd), e.cost, m)
                for m, e in est.items()
                if m != picked and e.n < n and e.cost < cur.cost and e.mean + Z_EXPLORE * e.sd >= cur.mean
            ]
            if cands and state.explored < state.requests + 2:
                return min(cands)[2], "bound"
            return super()._explore(task, state, picked, warm_only)

    Screen.z_pick = z_pick
    return Screen


class _ExchangeRate(Learner):
    def _explore(self, task: str, state: Any, picked: str, warm_only: bool = False) -> tuple[str, str] | None:
        s = self.settings
        cold = [m for m in self.models if self.pooled(m)[0] < s.warmup and m != picked]
        if cold:
            return min(cold, key=lambda m: (self.pooled(m)[0], self.price[m])), "warm-up"
        est = {e.model: e for e in self.estimates(task)}
        cur, top = est[picked], max(est.values(), key=lambda e: e.mean)
        rate = self.plan().rate
        cands = []
        for m, e in est.items():
            if m == picked or e.cost >= cur.cost or e.n >= 30:
                continue
            tau = cur.mean - (cur.cost - e.cost) / rate if rate > 0 else 0.0
            tau = max(tau, s.task_floor * top.mean)  # the mean at which it would replace the pick
            ucb = e.mean + Z_EXPLORE * e.sd
            if ucb >= tau:
                cands.append((-(ucb - tau) * (cur.cost - e.cost), m))
        if cands and not warm_only and state.explored < state.requests + 2:
            return min(cands)[1], "bound"
        return super()._explore(task, state, picked, warm_only)


def _best(share: float) -> type[Learner]:
    class Best(Learner):
        def _explore(
            self, task: str, state: Any, picked: str, warm_only: bool = False
        ) -> tuple[str, str] | None:
            got = super()._explore(task, state, picked, warm_only)
            if got is not None or warm_only:
                return got
            est = {e.model: e for e in self.estimates(task)}
            top = max(est.values(), key=lambda e: e.mean)
            cands = [
                (e.n, -e.mean, m)
                for m, e in est.items()
                if m != top.model
                and e.n < 30
                and e.cost <= top.cost * 1.05
                and e.mean + Z_EXPLORE * e.sd > top.mean + 0.5 * top.sd
            ]
            if cands and state.explored < 2 + share * state.requests:
                return min(cands)[2], "best"
            return None

    return Best


class _LagrangianTS(Learner):
    _lam = 5.0
    _costs: dict[str, dict[str, float]] | None = None

    def plan(self) -> Plan:
        fresh = self._plan is None or self._since_plan >= self.settings.replan_every
        plan = super().plan()
        if fresh or self._costs is None:  # lambda and the costs as of the plan
            names = list(self.tasks)
            est = {t: {e.model: e for e in self.estimates(t)} for t in names}
            n_t, got = self._served(names)
            bar = sum(n_t[t] * est[t][plan.best_single].mean for t in names)
            shortfall = self.settings.quality_target * bar - got
            self._lam = 5.0 * math.exp(max(-20.0, min(20.0, 0.1 * shortfall)))
            self._costs = {t: {m: e.cost for m, e in est[t].items()} for t in names}
        return plan

    def choose(self, task: str, rng: random.Random) -> Choice:
        task = self.name(task)
        state = self.task(task)
        state.requests += 1
        self.plan()
        cold = [m for m in self.models if self.pooled(m)[0] < self.settings.warmup]
        if cold:
            state.explored += 1
            self.explored += 1
            return Choice(min(cold, key=lambda m: (self.pooled(m)[0], self.price[m])), True, task, "warm-up")
        assert self._costs is not None
        cost = self._costs[task]
        cmax = max(cost.values())
        draws, means = {}, {}
        for m in self.models:
            arm = state.arms[m]
            c = self._centre(task, m)
            k = min(2.0, self._strengths.get(m, self._strength))
            draws[m] = rng.betavariate(c * k + arm.s + 1e-3, (1 - c) * k + arm.n - arm.s + 1e-3)
            means[m] = (c * k + arm.s) / (k + arm.n)

        def pick(values: Mapping[str, float]) -> str:
            top = max(values.values())
            ok = [m for m in self.models if values[m] >= self.settings.task_floor * top]
            return max(ok, key=lambda m: self._lam * values[m] - cost[m] / cmax)

        chosen, greedy = pick(draws), pick(means)
        if chosen != greedy:
            state.explored += 1
            self.explored += 1
        return Choice(chosen, chosen != greedy, task, "sample" if chosen != greedy else "plan")


def _sampled(z_pick: float) -> type[Learner]:
    class Sampled(Learner):
        _draw_seed = 1
        _eps: dict[str, float] | None = None

        def plan(self) -> Plan:
            if self._plan is None or self._since_plan >= self.settings.replan_every:
                rng = self.__dict__.setdefault("_rng", random.Random(self._draw_seed))
                self._eps = {m: rng.gauss(0, 1) for m in self.models}
                try:
                    return super().plan()
                finally:
                    self._eps = None
            return super().plan()

        def estimates(self, task: str) -> list[Estimate]:
            out = super().estimates(task)
            if self._eps is None:
                return out
            rng = self.__dict__["_rng"]
            drawn = []
            for e in out:
                own = math.sqrt(max(e.sd**2 - e.shared**2, 0.0))
                d = e.mean + own * rng.gauss(0, 1) + e.shared * self._eps[e.model]
                drawn.append(replace(e, mean=min(1.0, max(0.0, d))))
            return drawn

    Sampled.z_pick = z_pick
    return Sampled


class _LeaveOneOut(Learner):
    """The prior's strength from residuals corrected for each cell's own pull on the fit."""

    def _refit(self) -> None:
        super()._refit()
        a, b = self._fitted or ({}, {})
        cells = {(t, m): (arm.n, arm.s) for t, st in self.tasks.items() for m, arm in st.arms.items()}
        nm: dict[str, float] = defaultdict(float)
        nt: dict[str, float] = defaultdict(float)
        for (t, m), (n, _) in cells.items():
            nm[m] += n
            nt[t] += n
        per: dict[str, list[float]] = {}
        for (t, m), (n, s) in cells.items():
            if n < 1:
                continue
            p = min(0.99, max(0.01, sigmoid(a.get(m, 0.0) + b.get(t, 0.0))))
            h = min(0.9, n / (nm[m] + 1.0) + n / (nt[t] + 1.0))
            acc = per.setdefault(m, [0.0, 0.0, 0.0])
            acc[0] += ((s / n - p) / (1 - h)) ** 2 - p * (1 - p) / n
            acc[1] += p * (1 - p)
            acc[2] += 1
        weight = sum(v[2] for v in per.values())
        if not weight:
            return
        most = self.settings.prior_strength

        def worth(excess: float, spread: float, n: float) -> float:
            return max(1.0, min(most, (spread / n) / max(excess / n, 1e-6) - 1.0))

        ex, sp = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
        self._strength = worth(ex, sp, weight)
        ex0, sp0 = ex / weight * MODEL_CELLS, sp / weight * MODEL_CELLS
        self._strengths = {m: worth(v[0] + ex0, v[1] + sp0, v[2] + MODEL_CELLS) for m, v in per.items()}


def _bar(z: float) -> type[Learner]:
    class Bar(Learner):
        pass

    Bar.z_bar = z
    return Bar


class _BarServed(Learner):
    def _need(self, est: Mapping[str, Mapping[str, Estimate]], best_single: str) -> float:
        names = list(est)
        n_t, got = self._served(names)
        bar, rest = 0.0, []
        for t in names:
            own = self.tasks[t].arms[best_single]
            bar += own.s + (n_t[t] - own.n) * est[t][best_single].mean
            rest.append((n_t[t] - own.n, est[t][best_single]))
        bank = got - self.settings.quality_target * (bar + self.z_bar * _route_sd(rest))
        return -bank / max(1.0, 0.5 * sum(n_t.values()))


def _contender(k: int) -> type[Learner]:
    class Contender(Learner):
        def choose(self, task: str, rng: random.Random) -> Choice:
            plan = self.plan()
            c, name = plan.contender, self.name(task)
            if c and self.pooled(c)[0] < k and c != plan.best_single and rng.random() < 0.2:
                picked = plan.mix.get(name, [("", 1.0)])[0][0]
                if c != picked:
                    state = self.task(name)
                    state.requests += 1
                    state.explored += 1
                    self.explored += 1
                    return Choice(c, True, name, "reference")
            return super().choose(task, rng)

    return Contender


class Revealing(Learner):
    """A learner that also sees outcomes it did not serve (``eval routing --reveal``, probes):
    they teach its estimates, while what it owes is still counted on what it served (the
    replay keeps ``served_n`` / ``served_s``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served_n: dict[str, float] = defaultdict(float)
        self.served_s = 0.0

    def _served(self, names: Sequence[str]) -> tuple[dict[str, float], float]:
        return {t: self.served_n[t] for t in names}, self.served_s

    def served(self, task: str, score: float) -> None:
        self.served_n[self.name(task)] += 1
        self.served_s += score


class _Probing(Revealing):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probes: dict[str, int] = defaultdict(int)

    def candidate(self, task: str, picked: str) -> str | None:
        state = self.task(task)
        if self.probes[task] >= 0.2 * state.requests + 3:
            return None
        est = {e.model: e for e in self.estimates(task)}
        cur = est[picked]
        cands = [
            (-(e.mean + Z_EXPLORE * e.sd), e.cost, m)
            for m, e in est.items()
            if m != picked and e.cost < cur.cost and e.n < 30 and e.mean + Z_EXPLORE * e.sd >= 0.85 * cur.mean
        ]
        if not cands:
            return None
        self.probes[task] += 1
        return min(cands)[2]


def _probe(mode: str) -> After:
    def after(
        learner: Learner,
        task: str,
        served: str,
        score: float,
        scores: Mapping[str, float],
        costs: Mapping[str, float],
    ) -> float:
        assert isinstance(learner, _Probing)
        learner.served(task, score)
        m = learner.candidate(learner.name(task), served)
        if m is None:
            return 0.0
        if mode == "true" or score >= 0.5:
            learner.observe(task, m, scores[m], costs[m])
        elif mode == "zero":
            learner.observe(task, m, 0.0, costs[m])
        return costs[m]

    return after


DESIGNS: dict[str, Design] = {
    "screen": Design(_screen(8, 0.25)),
    "screen-pick-0.5": Design(_screen(8, 0.5)),
    "screen-pick-0.75": Design(_screen(8, 0.75)),
    "xrate": Design(_ExchangeRate),
    "best-5": Design(_best(0.05)),
    "best-10": Design(_best(0.10)),
    "lagrangian-ts": Design(_LagrangianTS),
    "sampled-plans": Design(_sampled(0.25)),
    "sampled-plans-z0": Design(_sampled(0.0), {"z": 0.0}),
    "prior-2": Design(settings={"prior_strength": 2.0}),
    "prior-4": Design(settings={"prior_strength": 4.0}),
    "prior-8": Design(settings={"prior_strength": 8.0}),
    "prior-2-explore-0.04": Design(settings={"prior_strength": 2.0, "explore_share": 0.04}),
    "prior-2-explore-0.08": Design(settings={"prior_strength": 2.0, "explore_share": 0.08}),
    "loo-strength": Design(_LeaveOneOut),
    "bar-mean": Design(_bar(0.0)),
    "bar-0.5": Design(_bar(0.5)),
    "bar-served": Design(_BarServed),
    "contender-40": Design(_contender(40)),
    "contender-80": Design(_contender(80)),
    "probes-true": Design(_Probing, after=_probe("true")),
    "probes-zero": Design(_Probing, after=_probe("zero")),
    "probes-skip": Design(_Probing, after=_probe("skip")),
}
