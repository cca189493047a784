"""The learned route's prior for a (task, model) it has little evidence on: an additive model
on the logit scale, ``logit q_tm = a_m + b_t`` (a model's strength, a task's ease), fitted to
every (task, model)'s feedback, with the models' catalog priors and easy-neutral tasks as a
weak anchor. A model that is good everywhere starts a new task good; a task where every model
did well starts every model high. Pure and small: a few sweeps of one-dimensional Newton
steps over at most (tasks x models) cells."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

ANCHOR = 1.0  # the anchors' weight, in observations' terms (L2 on the logit scale)
PRIOR_LOW, PRIOR_SPAN = 0.45, 0.2  # the price-rank prior: cheapest 0.45 .. dearest 0.65
MODEL_CELLS = 4.0  # a model's own spread is shrunk to the route's by this many cells


def logit(p: float) -> float:
    p = min(0.999, max(0.001, p))
    return math.log(p / (1.0 - p))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, x))))


def fit(
    cells: Mapping[tuple[str, str], tuple[float, float]],
    prior: Mapping[str, float],
    sweeps: int = 8,
    start: tuple[dict[str, float], dict[str, float]] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """``cells``: (task, model) -> (n, sum of scores); ``prior``: model -> catalog prior mean.
    Returns (a per model, b per task)."""
    a = {m: logit(p) for m, p in prior.items()}
    tasks = sorted({t for t, _ in cells})
    b = dict.fromkeys(tasks, 0.0)
    if start is not None:
        a.update({m: v for m, v in start[0].items() if m in a})
        b.update({t: v for t, v in start[1].items() if t in b})
    anchor = {m: logit(p) for m, p in prior.items()}
    by_model: dict[str, list[tuple[str, float, float]]] = {m: [] for m in a}
    by_task: dict[str, list[tuple[str, float, float]]] = {t: [] for t in tasks}
    for (t, m), (n, s) in cells.items():
        if n > 0 and m in by_model:
            by_model[m].append((t, n, s))
            by_task[t].append((m, n, s))
    for _ in range(sweeps):
        for m, obs in by_model.items():
            grad, hess = -ANCHOR * (a[m] - anchor[m]), ANCHOR
            for t, n, s in obs:
                p = sigmoid(a[m] + b[t])
                grad += s - n * p
                hess += n * p * (1 - p)
            a[m] += grad / hess
        for t, obs2 in by_task.items():
            grad, hess = -ANCHOR * b[t], ANCHOR
            for m, n, s in obs2:
                p = sigmoid(a[m] + b[t])
                grad += s - n * p
                hess += n * p * (1 - p)
            b[t] += grad / hess
    return a, b


def strength(
    cells: Mapping[tuple[str, str], tuple[float, float]],
    predict: Callable[[str, str], float],
    most: float,
    least: float = 1.0,
) -> tuple[float, dict[str, float]]:
    """How many observations the additive prediction is worth (empirical Bayes): from how far
    the cells with evidence sit from it beyond their sampling noise (``tau2``), the Beta
    strength whose spread matches, ``p(1-p)/tau2 - 1``, within [``least``, ``most``]. A route
    whose models are good or bad across the board trusts it; one whose models each shine on
    their own tasks leans on each task's own evidence. Returns the route's strength and each
    model's: from its own cells' spread, shrunk to the route's by ``MODEL_CELLS`` cells (a
    specialist, good where the others are not, is not pulled to the others' pattern)."""
    per: dict[str, list[float]] = {}  # model -> [excess, spread, cells]
    for (t, m), (n, s) in cells.items():
        if n < 1:
            continue
        p = min(0.99, max(0.01, predict(t, m)))
        acc = per.setdefault(m, [0.0, 0.0, 0.0])
        acc[0] += (s / n - p) ** 2 - p * (1 - p) / n  # each cell once: the spread of the cells
        acc[1] += p * (1 - p)
        acc[2] += 1
    weight = sum(v[2] for v in per.values())
    if weight == 0:
        return most, {}

    def worth(excess: float, spread: float, cells: float) -> float:
        tau2 = max(excess / cells, 1e-6)
        return max(least, min(most, (spread / cells) / tau2 - 1.0))

    excess, spread = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
    route = worth(excess, spread, weight)
    ex0, sp0 = excess / weight * MODEL_CELLS, spread / weight * MODEL_CELLS
    return route, {m: worth(v[0] + ex0, v[1] + sp0, v[2] + MODEL_CELLS) for m, v in per.items()}


def prior_means(
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
