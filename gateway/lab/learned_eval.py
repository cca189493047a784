"""Replay a labelled stream through the learned route's decision rule (routing/learned.py, the
code the live route runs), revealing only the chosen model's outcome, and compare it with the
hindsight baselines: best single model, cheapest single model at 95% of it, per-task oracle
(per task, the cheapest model within 95% of that task's best) and per-prompt oracle.

A stream is JSON lines: ``{"task": str, "prompt": str, "scores": {model: 0..1},
"costs": {model: USD}}``; an optional first line ``{"models": {name: {"price": float,
"ability": float?}}}`` gives the catalog prior (without it, each model's mean cost on the
stream stands in for its list price, and no ability is known)."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.lab.learned_designs import DESIGNS, Design, Revealing
from gateway.routing.learned import Choice, Estimate, Learner, LearnSettings


@dataclass(frozen=True, slots=True)
class Row:
    task: str
    scores: Mapping[str, float]
    costs: Mapping[str, float]
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class Stream:
    rows: list[Row]
    models: list[str]
    price: dict[str, float]
    ability: dict[str, float]


def read_stream(path: Path) -> Stream:
    rows: list[Row] = []
    meta: dict[str, Any] = {}
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = orjson.loads(line)
            if "models" in obj and "task" not in obj:
                meta = obj["models"]
                continue
            try:
                rows.append(Row(str(obj["task"]), obj["scores"], obj["costs"], str(obj.get("prompt", ""))))
            except (KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: a row needs task, scores and costs ({exc})") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    models = sorted(set(rows[0].scores).intersection(*(r.scores.keys() for r in rows)))
    if not models:
        raise ValueError(f"{path}: no model is scored on every row")
    price = {m: float(meta[m]["price"]) for m in models if m in meta and "price" in meta[m]}
    for m in models:
        price.setdefault(m, sum(r.costs[m] for r in rows) / len(rows))
    ability = {m: float(meta[m]["ability"]) for m in models if m in meta and "ability" in meta[m]}
    return Stream(rows, models, price, ability)


def half(stream: Stream, which: int) -> Stream:
    """One half of the stream's tasks (``which`` 0 or 1: every other task in the order of
    their names' SHA-1), to tune on one half and report on the other."""
    tasks = sorted({r.task for r in stream.rows}, key=lambda t: hashlib.sha1(t.encode()).hexdigest())
    keep = set(tasks[which::2])
    return Stream([r for r in stream.rows if r.task in keep], stream.models, stream.price, stream.ability)


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    quality: float
    cost: float


def _totals(rows: Sequence[Row], pick: Iterable[str]) -> tuple[float, float]:
    q = c = 0.0
    for row, m in zip(rows, pick, strict=True):
        q += row.scores[m]
        c += row.costs[m]
    return q / len(rows), c


def baselines(stream: Stream) -> tuple[list[Line], str, dict[str, float]]:
    """The hindsight lines, the best single model, and each task's best model's quality."""
    rows, models = stream.rows, stream.models
    single = {m: _totals(rows, [m] * len(rows)) for m in models}
    best = max(models, key=lambda m: single[m][0])
    good = [m for m in models if single[m][0] >= 0.95 * single[best][0]]
    cheap = min(good, key=lambda m: single[m][1])
    by_task: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_task[r.task].append(r)
    task_pick: dict[str, str] = {}
    task_best: dict[str, float] = {}
    for t, trows in by_task.items():
        q = {m: sum(r.scores[m] for r in trows) / len(trows) for m in models}
        c = {m: sum(r.costs[m] for r in trows) for m in models}
        task_best[t] = max(q.values())
        task_pick[t] = min((m for m in models if q[m] >= 0.95 * task_best[t]), key=lambda m: c[m])
    per_task = _totals(rows, [task_pick[r.task] for r in rows])
    per_prompt = _totals(
        rows,
        [min(models, key=lambda m, r=r: (-r.scores[m], r.costs[m])) for r in rows],  # type: ignore[misc]
    )
    route = route_oracle(stream, by_task, LearnSettings())
    lines = [
        Line(f"best single ({best})", *single[best]),
        Line(f"cheapest single at 95% ({cheap})", *single[cheap]),
        Line("per-task oracle (95% of each task's best)", *per_task),
        Line("per-prompt oracle", *per_prompt),
        Line("route oracle (the learned route's rule on the true means)", *route),
    ]
    return lines, best, task_best


def route_oracle(
    stream: Stream, by_task: Mapping[str, list[Row]], settings: LearnSettings
) -> tuple[float, float]:
    """What the learned route's plan would do knowing every (task, model)'s true mean score and
    cost: the same planner, fed the whole stream's outcomes as near-certain evidence."""
    learner = _Oracle(stream.models, stream.price, stream.ability, settings)
    big = 1e6
    for t, trows in by_task.items():
        state = learner.task(t)
        state.requests = len(trows)
        for m in stream.models:
            arm = state.arms[m]
            arm.n, arm.s = big, big * sum(r.scores[m] for r in trows) / len(trows)
            arm.cost_n, arm.cost_sum = len(trows), sum(r.costs[m] for r in trows)
    mix = learner.plan().mix
    q = c = 0.0
    for r in stream.rows:
        for m, share in mix[r.task]:
            q += share * r.scores[m]
            c += share * r.costs[m]
    return q / len(stream.rows), c


class _Oracle(Learner):
    """The planner on known means: nothing served yet, so nothing to make up."""

    def _need(self, est: Mapping[str, Mapping[str, Estimate]], best_single: str) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class Replay:
    quality: float
    cost: float
    explored: float  # share of requests that explored
    explore_cost: float
    per_task: dict[str, tuple[int, float]]  # task -> (requests, realised quality)
    believed_best: str = ""  # the model the learner takes for the best single one at the end


REVEALS = ("served", "cheaper", "all")  # whose outcomes the learner sees: see ``revealed``


def revealed(stream: Stream, reveal: str, best: str) -> frozenset[str]:
    """The models whose outcome a replay shows besides the served one: none (``served``, the
    route's real information), every model priced below the best single one (``cheaper``:
    as if trying a cheap model cost no quality), or every model (``all``)."""
    if reveal == "all":
        return frozenset(stream.models)
    if reveal == "cheaper":
        return frozenset(m for m in stream.models if stream.price[m] < stream.price[best])
    return frozenset()


Pick = Callable[[Row, Choice, Learner], str]


def replay(
    stream: Stream,
    settings: LearnSettings,
    seed: int = 0,
    pick: Pick | None = None,
    shown: frozenset[str] = frozenset(),
    design: Design | None = None,
) -> Replay:
    """Run the stream through one learner: each row's chosen model's score and cost only (and
    the scores of ``shown``, a diagnostic: see ``revealed``). ``pick``
    (lab/learned_per_prompt.py) may serve another model than the learner's choice; the learner
    observes the model served. ``design``: a variant of the rule (lab/learned_designs.py)."""
    cls = design.learner if design is not None else Revealing if shown else Learner
    learner = cls(stream.models, stream.price, stream.ability, settings)
    after = design.after if design is not None else None
    rng = random.Random(seed)
    q = c = ec = 0.0
    explored = 0
    tq: dict[str, list[float]] = defaultdict(list)
    for row in stream.rows:
        choice = learner.choose(row.task, rng)
        if pick is not None:
            choice = Choice(pick(row, choice, learner), choice.explore, choice.task, choice.why)
        score, cost = row.scores[choice.model], row.costs[choice.model]
        learner.observe(row.task, choice.model, score, cost, choice.explore)
        if shown and isinstance(learner, Revealing):
            learner.served(row.task, score)
            for m in shown - {choice.model}:
                learner.observe(row.task, m, row.scores[m])
        if after is not None:  # a design's background calls (probes): their cost counts
            c += after(learner, row.task, choice.model, score, row.scores, row.costs)
        q += score
        c += cost
        tq[row.task].append(score)
        if choice.explore:
            explored += 1
            ec += cost
    n = len(stream.rows)
    per_task = {t: (len(v), sum(v) / len(v)) for t, v in tq.items()}
    return Replay(q / n, c, explored / n, ec, per_task, learner.plan().best_single)


def report(
    stream: Stream, settings: LearnSettings, seeds: int = 3, reveal: str = "served", design: str | None = None
) -> dict[str, Any]:
    """The table of one stream: the learned route (mean over ``seeds`` orderings of the stream)
    beside the baselines, and the targets' checks. ``reveal``: see ``revealed``; ``design``: a
    variant of the rule instead (lab/learned_designs.DESIGNS)."""
    lines, best, task_best = baselines(stream)
    ref = lines[0]
    shown = revealed(stream, reveal, best)
    variant = DESIGNS[design] if design is not None else None
    if variant is not None:
        settings = variant.apply(settings)
    runs = []
    for seed in range(seeds):
        rows = list(stream.rows)
        random.Random(seed).shuffle(rows)
        ordered = Stream(rows, stream.models, stream.price, stream.ability)
        runs.append(replay(ordered, settings, seed, shown=shown, design=variant))
    quality = sum(r.quality for r in runs) / seeds
    cost = sum(r.cost for r in runs) / seeds
    name = f"learned (q={settings.quality_target}, floor={settings.task_floor})"
    if reveal != "served":
        name += f", shown {reveal}: {len(shown)} models' outcomes"
    if design is not None:
        name += f", design {design}"
    learned = Line(name, quality, cost)
    worst_task = []
    for run in runs:
        for t, (n, tq) in run.per_task.items():
            if n >= 100 and task_best[t] > 0:
                worst_task.append((tq / task_best[t], t))
    at_floor = sum(1 for ratio, _ in worst_task if ratio >= settings.task_floor)
    table = [
        {
            "line": ln.name,
            "quality": round(ln.quality, 4),
            "quality_vs_best": round(ln.quality / ref.quality, 4) if ref.quality else None,
            "cost_usd": round(ln.cost, 6),
            "cost_vs_best": round(ln.cost / ref.cost, 4) if ref.cost else None,
        }
        for ln in (*lines, learned)
    ]
    worst = min(worst_task) if worst_task else (1.0, "")
    return {
        "rows": len(stream.rows),
        "models": len(stream.models),
        "tasks": len(task_best),
        "table": table,
        "explored_share": round(sum(r.explored for r in runs) / seeds, 4),
        "explore_cost_vs_best": round(sum(r.explore_cost for r in runs) / seeds / ref.cost, 4)
        if ref.cost
        else None,
        "worst_task_vs_its_best": {"task": worst[1], "ratio": round(worst[0], 4)},
        "tasks_at_floor": {"met": at_floor, "of": len(worst_task)},  # (task, ordering) pairs, >= 100 requests
        "best_single": best,
        "orderings": [
            {
                "quality_vs_best": round(r.quality / ref.quality, 4) if ref.quality else None,
                "cost_vs_best": round(r.cost / ref.cost, 4) if ref.cost else None,
                "believed_best": r.believed_best,
            }
            for r in runs
        ],
    }
