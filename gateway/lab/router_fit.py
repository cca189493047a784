"""Fit the complexity classifier: two L2-regularised logistic regressions (Newton's method,
pure numpy, deterministic) on [embedding, standardised text features], one predicting that the
strong model answers correctly and one that the weak model does, combined in RouterModel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.routing.features import FEATURE_NAMES, feature_matrix

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str
    weak_correct: bool
    strong_correct: bool
    group: str  # task/domain, for grouped cross-validation


def _sigmoid(z: F64) -> F64:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)), dtype=np.float64)


def fit_logistic(x: F64, y: F64, l2: float, iters: int = 30) -> tuple[F64, float]:
    """Weights and bias minimising mean log-loss + l2/2 * |w|^2 (the bias is not penalised)."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2)
    reg[-1] = 0.0
    for _ in range(iters):
        p = _sigmoid(xb @ w)
        grad = xb.T @ (p - y) / n + reg * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb / n + np.diag(reg) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.max(np.abs(step))) < 1e-6:
            break
    return w[:-1], float(w[-1])


@dataclass(frozen=True, slots=True)
class Design:
    """How raw inputs become the model's input: feature standardisation and the embedding weight."""

    mean: F64
    std: F64
    emb_scale: float

    def matrix(self, emb: F32, feats: F64) -> F64:
        f = (feats.astype(np.float64) - self.mean) / self.std
        return np.hstack([emb.astype(np.float64) * self.emb_scale, f])


def make_design(feats: F64, emb_scale: float = 1.0) -> Design:
    mean = feats.astype(np.float64).mean(axis=0)
    std = feats.astype(np.float64).std(axis=0)
    std[std < 1e-6] = 1.0
    return Design(mean, std, emb_scale)


def correctness(examples: list[Example]) -> tuple[F64, F64]:
    weak = np.array([1.0 if e.weak_correct else 0.0 for e in examples])
    strong = np.array([1.0 if e.strong_correct else 0.0 for e in examples])
    return weak, strong


@dataclass(frozen=True, slots=True)
class Fitted:
    design: Design
    w: F64
    b: float

    def scores(self, emb: F32, feats: F64) -> F64:
        return _sigmoid(self.design.matrix(emb, feats) @ self.w + self.b)


def fit(emb: F32, feats: F64, y: F64, l2: float, emb_scale: float = 1.0) -> Fitted:
    design = make_design(feats, emb_scale)
    w, b = fit_logistic(design.matrix(emb, feats), y, l2)
    return Fitted(design, w, b)


LOG_CHARS = FEATURE_NAMES.index("log_chars")


@dataclass(frozen=True, slots=True)
class RouterModel:
    """Two logistic heads on one design: P(strong model correct) and P(weak model correct).

    raw   = alpha * P(strong ok) - P(weak ok) + length_coef * standardised log(prompt chars)
    score = sigmoid((raw - center) / scale)        (monotone in raw; spreads scores over 0..1)

    alpha < 1 leans towards "the weak model fails" (alpha = 0) from the pure expected gain
    (alpha = 1); the length prior encodes "longer prompts are harder", which holds within every
    task we measured, while the heads' own length weights are learnt across tasks."""

    strong: Fitted
    weak: Fitted
    alpha: float
    length_coef: float
    center: float = 0.0
    scale: float = 1.0

    def raw(self, emb: F32, feats: F64) -> F64:
        z = (feats[:, LOG_CHARS] - self.strong.design.mean[LOG_CHARS]) / self.strong.design.std[LOG_CHARS]
        raw = (
            self.alpha * self.strong.scores(emb, feats) - self.weak.scores(emb, feats) + self.length_coef * z
        )
        return np.asarray(raw, dtype=np.float64)

    def scores(self, emb: F32, feats: F64) -> F64:
        return _sigmoid((self.raw(emb, feats) - self.center) / self.scale)


def fit_router(
    emb: F32, feats: F64, weak: F64, strong: F64, l2: float, alpha: float, length_prior: float
) -> RouterModel:
    """Fit both heads; the length coefficient is ``length_prior`` standard deviations of the
    heads' combined score (so the prior's weight does not depend on the heads' scale)."""
    design = make_design(feats)
    x = design.matrix(emb, feats)
    ws, bs = fit_logistic(x, strong, l2)
    ww, bw = fit_logistic(x, weak, l2)
    model = RouterModel(Fitted(design, ws, bs), Fitted(design, ww, bw), alpha, 0.0)
    spread = float(np.std(model.raw(emb, feats))) or 1.0
    model = RouterModel(model.strong, model.weak, alpha, length_prior * spread)
    raw = model.raw(emb, feats)
    return RouterModel(
        model.strong, model.weak, alpha, model.length_coef, float(np.median(raw)), float(np.std(raw)) or 1.0
    )


def group_folds(groups: list[str], k: int, seed: int) -> list[npt.NDArray[np.int64]]:
    """Indices of k folds that never split a group (task/domain) across folds (with fewer
    than k groups: random folds over the rows)."""
    names = sorted(set(groups))
    rng = np.random.default_rng(seed)
    if len(names) < k:  # too few groups to hold any out: plain random folds over the rows
        perm = rng.permutation(len(groups))
        return [np.sort(perm[f::k]) for f in range(k)]
    rng.shuffle(names)
    fold_of = {g: i % k for i, g in enumerate(names)}
    gi = np.array([fold_of[g] for g in groups])
    return [np.flatnonzero(gi == f) for f in range(k)]


def calibration_curve(scores: F64, weak: F64, strong: F64, points: int = 41) -> list[dict[str, float]]:
    """threshold -> expected share of prompts sent to the strong model and expected quality
    (accuracy of the routed mix / accuracy of always-strong), over score quantiles."""
    strong_acc = float(strong.mean())
    curve = []
    for t in np.unique(np.quantile(scores, np.linspace(0.0, 1.0, points))):
        sel = scores >= t
        acc = float(np.where(sel, strong, weak).mean())
        curve.append(
            {
                "threshold": round(float(t), 6),
                "strong_fraction": round(float(sel.mean()), 6),
                "quality": round(acc / strong_acc, 6) if strong_acc else 0.0,
            }
        )
    top = float(scores.max()) + 1e-6
    weak_q = float(weak.mean()) / strong_acc if strong_acc else 0.0
    curve.append({"threshold": round(top, 6), "strong_fraction": 0.0, "quality": round(weak_q, 6)})
    return curve


def feature_table(examples: list[Example]) -> F64:
    return feature_matrix([e.prompt for e in examples])
