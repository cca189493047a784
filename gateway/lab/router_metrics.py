"""Router quality metrics exactly as RouteLLM computes them (routellm/evals/evaluate.py and
benchmarks.py), plus dollars.

RouteLLM's procedure, reproduced here:
  * thresholds: the 11 edges of ``pd.qcut(scores, 10)`` (quantiles 0, 0.1, ..., 1 with linear
    interpolation); a prompt goes to the strong model when ``score >= threshold``, except at the
    last edge where it is ``score > threshold`` (so the curve reaches 0% strong calls);
  * at each threshold: accuracy (%) = mean of the routed model's correctness, strong % = share
    of prompts sent to the strong model; points sorted by strong %;
  * APGR = (AUC - weak_AUC) / (strong_AUC - weak_AUC), AUC = trapezoid of accuracy over
    strong %/100, weak/strong_AUC the same for the constant always-weak/always-strong accuracy;
  * CPT(x%) = ``np.interp(weak + x * (strong - weak), accuracies, strong_percentages)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class CurvePoint:
    threshold: float
    strong_pct: float  # 0..100
    accuracy: float  # 0..100


@dataclass(frozen=True, slots=True)
class RouterMetrics:
    apgr: float
    cpt50: float  # % strong calls
    cpt80: float
    curve: tuple[CurvePoint, ...]


def quantile_thresholds(scores: Floats, num_results: int = 10) -> Floats:
    """The bin edges ``pd.qcut(scores, num_results, retbins=True)`` returns (before its
    small widening of the outer edges, which no score can fall between)."""
    q = np.linspace(0.0, 1.0, num_results + 1)
    return np.asarray(np.quantile(scores, q, method="linear"), dtype=np.float64)


def routellm_curve(
    scores: Floats, weak: Floats, strong: Floats, num_results: int = 10
) -> tuple[CurvePoint, ...]:
    thresholds = quantile_thresholds(scores, num_results)
    points = []
    last = len(thresholds) - 1
    for i, t in enumerate(thresholds):
        sel = scores >= t if i != last else scores > t
        acc = float(np.where(sel, strong, weak).mean() * 100.0)
        points.append(CurvePoint(float(t), float(sel.mean() * 100.0), acc))
    points.sort(key=lambda p: p.strong_pct)  # stable: ties keep threshold order
    return tuple(points)


def _trapz(y: Floats, x: Floats) -> float:
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0)) if len(x) > 1 else 0.0


def apgr(curve: tuple[CurvePoint, ...], weak_acc: float, strong_acc: float) -> float:
    x = np.array([p.strong_pct for p in curve]) / 100.0
    y = np.array([p.accuracy for p in curve])
    auc = _trapz(y, x)
    weak_auc = _trapz(np.full_like(x, weak_acc), x)
    strong_auc = _trapz(np.full_like(x, strong_acc), x)
    if strong_auc == weak_auc:
        return float("nan")
    return (auc - weak_auc) / (strong_auc - weak_auc)


def cpt(curve: tuple[CurvePoint, ...], weak_acc: float, strong_acc: float, fraction: float) -> float:
    """% of strong calls needed to recover ``fraction`` of the weak->strong gap (RouteLLM)."""
    acc = np.array([p.accuracy for p in curve])
    pct = np.array([p.strong_pct for p in curve])
    return float(np.interp(fraction * (strong_acc - weak_acc) + weak_acc, acc, pct))


def router_metrics(scores: Floats, weak: Floats, strong: Floats, num_results: int = 10) -> RouterMetrics:
    """APGR, CPT(50%), CPT(80%) of ``scores`` (higher = strong) on correctness arrays."""
    weak_acc = float(weak.mean() * 100.0)
    strong_acc = float(strong.mean() * 100.0)
    curve = routellm_curve(scores, weak, strong, num_results)
    return RouterMetrics(
        apgr=apgr(curve, weak_acc, strong_acc),
        cpt50=cpt(curve, weak_acc, strong_acc, 0.5),
        cpt80=cpt(curve, weak_acc, strong_acc, 0.8),
        curve=curve,
    )


def oracle_scores(weak: Floats, strong: Floats) -> Floats:
    """Scores of a router that knows the answers: strong-only-correct first, weak-only last."""
    return np.asarray(strong - weak, dtype=np.float64)


# ----------------------------------------------------------------------------- dollars
@dataclass(frozen=True, slots=True)
class CostPoint:
    strong_pct: float
    accuracy: float  # 0..100
    dollars: float


def cost_curve(
    scores: Floats, weak: Floats, strong: Floats, weak_cost: Floats, strong_cost: Floats
) -> list[CostPoint]:
    """Every distinct routing of ``scores`` (strong when score >= t, for each distinct score,
    plus nothing to strong): accuracy and dollars, sorted by strong %."""
    order = np.argsort(-scores, kind="stable")
    s = scores[order]
    gain_acc = (strong - weak)[order]
    gain_cost = (strong_cost - weak_cost)[order]
    n = len(scores)
    base_acc, base_cost = float(weak.sum()), float(weak_cost.sum())
    cum_acc = np.concatenate([[0.0], np.cumsum(gain_acc)])
    cum_cost = np.concatenate([[0.0], np.cumsum(gain_cost)])
    # cut points: k prompts go strong, only where a score boundary allows it (ties go together)
    cuts = [0] + [k for k in range(1, n + 1) if k == n or s[k] != s[k - 1]]
    return [
        CostPoint(100.0 * k / n, 100.0 * (base_acc + cum_acc[k]) / n, base_cost + float(cum_cost[k]))
        for k in cuts
    ]


def cost_at_quality(points: list[CostPoint], target_acc: float) -> float | None:
    """Fewest dollars among routings whose accuracy reaches ``target_acc`` (%); None if none."""
    ok = [p.dollars for p in points if p.accuracy >= target_acc - 1e-9]
    return min(ok) if ok else None
