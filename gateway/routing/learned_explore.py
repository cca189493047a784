"""The learned route's exploration choice, pure: which target (if any) a request of a task
should try instead of the plan's pick, and why. Exploration is bounded and paid like any
request:

* a warm-up: every model ``warmup`` times over the route (the cheapest first), then every model
  cheaper than the pick once on each task, unless its upper bound (prior and all) is below the
  floor (the shared centre's spread keeps that bound wide until the model is known);
* then, within ``explore_share`` of the task's requests (2.5x for cheaper candidates), a cheaper
  model whose upper bound still reaches the floor (``bound``, the most promising first) or one
  that could be the task's best (``best``); only the warm-up while the route has no quality to
  spend (``warm_only``)."""

from __future__ import annotations

from typing import Final, Protocol

from gateway.routing.learned_state import Estimate, LearnSettings, TaskState

Z_EXPLORE: Final = 2.0  # upper bound used to decide whether a model could still matter


class Evidence(Protocol):
    """What the choice reads of a learner (``learned.Learner``)."""

    models: tuple[str, ...]
    settings: LearnSettings
    price: dict[str, float]

    def pooled(self, model: str) -> tuple[float, float]: ...
    def estimate(self, task: str, model: str) -> Estimate: ...
    def estimates(self, task: str) -> list[Estimate]: ...


def explore(
    learner: Evidence, task: str, state: TaskState, picked: str, warm_only: bool = False
) -> tuple[str, str] | None:
    s = learner.settings
    cold = [m for m in learner.models if learner.pooled(m)[0] < s.warmup and m != picked]
    if cold:  # warm-up: every model a few times over the route, the cheapest first
        return min(cold, key=lambda m: (learner.pooled(m)[0], learner.price[m])), "warm-up"
    # every cheaper model once on each task, unless its upper bound (prior and all) is below
    # the floor: the shared centre's spread keeps that bound wide until the model is known
    unseen = [m for m in learner.models if state.arms[m].n < 1 and learner.price[m] < learner.price[picked]]
    if unseen:
        cur = learner.estimate(task, picked)
        unseen = [
            m
            for m in unseen
            if (e := learner.estimate(task, m)).mean + Z_EXPLORE * e.sd >= s.task_floor * cur.mean
        ]
    if unseen:
        return min(unseen, key=lambda m: learner.price[m]), "warm-up"
    if warm_only:
        return None
    est = {e.model: e for e in learner.estimates(task)}
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
