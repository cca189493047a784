"""The learned route with a per-prompt scorer on its mixes (`switchyard eval routing
--per-prompt`): where a task's plan mixes two models (a step of its frontier taken in part:
``[(cheaper, f), (dearer, 1 - f)]``), the live route draws one at random. Here the prompt goes
to the dearer model iff its score (higher = needs a stronger model) ranks in the top ``1 - f``
of the task's last ``window`` scores, itself included (an online quantile, as the verifier
cascade's ``ShareCalibrator``), else to the cheaper one. Everything else (exploration, what the
learner observes, the plan) is the learned route's code, on the same orderings and seeds as the
plain replay (lab/learned_eval.py), so the two lines are paired.

Lines: the plain learned route, the same with the scorer, with a random score (a control: the
difference a score without information makes, the replay's noise) and with a hindsight score
(whether the dearer model of the pair does better on this prompt: the most any per-prompt
scorer could add on these mixes). The scorer's power on the decisions it made: the AUC, within
(task, pair), of "the cheaper model fails" (its score below 0.5) and of "the dearer model does
better"."""

from __future__ import annotations

import bisect
import collections
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.lab.learned_eval import Replay, Row, Stream, baselines, replay
from gateway.routing.learned import Choice, Learner, LearnSettings

WINDOW: Final = 200
MIN_GROUP: Final = 20  # decisions of a (task, pair) before its AUC counts
GOLDEN: Final = 0.6180339887498949

# score(row, cheaper, dearer): higher = send to the dearer model
Score = Callable[[Row, str, str], float]


class RecentQuantile:
    """Is a value in the top ``share`` of the last ``window`` values (itself included)? A value
    tied with others at the cut goes up for the share of the tie the budget leaves (a
    low-discrepancy draw), so a run of equal values sends about ``share`` of them up."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._recent: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []
        self._phase = 0.0

    def top(self, value: float, share: float) -> bool:
        self._recent.append(value)
        bisect.insort(self._sorted, value)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        n = len(self._sorted)
        below = bisect.bisect_left(self._sorted, value)
        ties = bisect.bisect_right(self._sorted, value) - below
        room = share * n - (n - below - ties)  # places left above the values above it
        if room <= 0 or room >= ties:
            return room > 0
        self._phase = (self._phase + GOLDEN) % 1.0
        return self._phase < room / ties


@dataclass(frozen=True, slots=True)
class Decision:
    group: tuple[str, str, str]  # task, cheaper, dearer
    score: float
    cheaper_fails: bool
    dearer_better: bool


@dataclass(slots=True)
class PerPrompt:
    """The replay's ``pick``: per-prompt on the mixes' exploit decisions, the learner's choice
    elsewhere."""

    score: Score
    window: int = WINDOW
    windows: dict[str, RecentQuantile] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)

    def __call__(self, row: Row, choice: Choice, learner: Learner) -> str:
        if choice.explore or choice.why != "mix":
            return choice.model
        task = learner.name(row.task)
        mix = learner.plan().mix[task]  # the plan choose() just drew from: [(cheaper, f), (dearer, 1 - f)]
        (cheap, _), (dear, dear_share) = mix
        value = self.score(row, cheap, dear)
        quantile = self.windows.setdefault(task, RecentQuantile(self.window))
        up = quantile.top(value, dear_share)
        self.decisions.append(
            Decision(
                (task, cheap, dear), value, row.scores[cheap] < 0.5, row.scores[dear] > row.scores[cheap]
            )
        )
        return dear if up else cheap


def difficulty_score(scores: Mapping[str, float]) -> Score:
    """A pair-agnostic score looked up by the prompt's text."""
    return lambda row, _cheap, _dear: scores[row.prompt]


def hindsight_score(row: Row, cheap: str, dear: str) -> float:
    return row.scores[dear] - row.scores[cheap]


def random_score(row: Row, _cheap: str, _dear: str) -> float:
    """Uniform in [0, 1), fixed per prompt (its text's SHA-1)."""
    return int.from_bytes(hashlib.sha1(row.prompt.encode()).digest()[:8], "big") / 2**64


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """P(a positive's value > a negative's), ties counted half (Mann-Whitney)."""
    ranked = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        mid = (i + j + 1) / 2  # mean 1-based rank of the tie
        rank_sum += mid * sum(lab for _, lab in ranked[i:j])
        i = j
    n_pos, n_neg = len(pos), len(neg)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def within_auc(decisions: Sequence[Decision], label: Callable[[Decision], bool]) -> float | None:
    """The AUC within each (task, pair) with at least MIN_GROUP decisions and both classes,
    weighted by its decisions; None when no group qualifies."""
    groups: dict[tuple[str, str, str], list[Decision]] = collections.defaultdict(list)
    for d in decisions:
        groups[d.group].append(d)
    total = weight = 0.0
    for ds in groups.values():
        pos = [d.score for d in ds if label(d)]
        neg = [d.score for d in ds if not label(d)]
        if len(ds) >= MIN_GROUP and pos and neg:
            total += len(ds) * auc(pos, neg)
            weight += len(ds)
    return round(total / weight, 4) if weight else None


def orderings(stream: Stream, seeds: int) -> list[Stream]:
    """The shuffled streams of lab/learned_eval.report, seed by seed."""
    out = []
    for seed in range(seeds):
        rows = list(stream.rows)
        random.Random(seed).shuffle(rows)
        out.append(Stream(rows, stream.models, stream.price, stream.ability))
    return out


def paired(
    stream: Stream, settings: LearnSettings, score: Score, seeds: int = 3, window: int = WINDOW
) -> dict[str, Any]:
    """The learned route, plain and with ``score`` on its mixes (and with the hindsight score),
    each the mean over ``seeds`` orderings, against the best single model."""
    lines, best, _ = baselines(stream)
    ref = lines[0]
    runs: dict[str, list[Replay]] = {
        "learned": [],
        "learned + per-prompt": [],
        "learned + random score": [],
        "learned + hindsight": [],
    }
    picks: list[PerPrompt] = []
    for seed, ordered in enumerate(orderings(stream, seeds)):
        runs["learned"].append(replay(ordered, settings, seed))
        picks.append(PerPrompt(score, window))
        runs["learned + per-prompt"].append(replay(ordered, settings, seed, picks[-1]))
        for name, other in (
            ("learned + random score", random_score),
            ("learned + hindsight", hindsight_score),
        ):
            runs[name].append(replay(ordered, settings, seed, PerPrompt(other, window)))
    assert all(len(rs) == seeds for rs in runs.values())
    means = {
        name: (sum(r.quality for r in rs) / seeds, sum(r.cost for r in rs) / seeds)
        for name, rs in runs.items()
    }
    rq = {
        name: (q / ref.quality if ref.quality else 0.0, c / ref.cost if ref.cost else 0.0)
        for name, (q, c) in means.items()
    }
    table = [
        {
            "line": name,
            "quality": round(q, 4),
            "quality_vs_best": round(rq[name][0], 4),
            "cost_usd": round(c, 6),
            "cost_vs_best": round(rq[name][1], 4),
        }
        for name, (q, c) in means.items()
    ]
    plain, scored, control = rq["learned"], rq["learned + per-prompt"], rq["learned + random score"]
    decisions = [d for p in picks for d in p.decisions]
    return {
        "rows": len(stream.rows),
        "seeds": seeds,
        "best_single": best,
        "table": table,
        "difference": {
            "quality_vs_best": round(scored[0] - plain[0], 4),
            "cost_vs_best": round(scored[1] - plain[1], 4),
        },
        "control_difference": {
            "quality_vs_best": round(control[0] - plain[0], 4),
            "cost_vs_best": round(control[1] - plain[1], 4),
        },
        "mix_share": round(len(decisions) / (seeds * len(stream.rows)), 4),
        "auc_cheaper_fails": within_auc(decisions, lambda d: d.cheaper_fails),
        "auc_dearer_better": within_auc(decisions, lambda d: d.dearer_better),
    }
