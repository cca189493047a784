"""Further difficulty designs for the cross-task comparison (`switchyard eval router --multi`),
beside the joint families of gateway.lab.irt_fit. Each is fitted on the training prompts of a
split only and scores a prompt from its embedding, the 17 text features and the answer-format
and rarity traits (gateway.routing.prompt_traits); higher = needs a stronger model.

Targets (per prompt, pooled over every model of its source; dense and less noisy than one
pair's outcome):
- ``resid``: the prompt's mean residual success (outcome minus the model's mean), so a
  difficulty is minus its prediction (the fraction of models that got it right, centred);
- ``gain``: the covariance, over the source's models, of the outcome with the model's
  standardised logit accuracy: large where strong models succeed and weak ones fail (the
  prompts worth routing up), near 0 where every model succeeds or every model fails. For a
  source of two models it is half the strong-minus-weak outcome.

Learners: ridge (closed form, linear in [embedding, features, traits]; shippable as one dot
product) and gradient-boosted trees (sklearn HistGradientBoosting over the features, traits
and 16 principal components of the embedding). Families: ``ridge-x`` and ``gbt`` (resid),
``gain`` and ``gbt-gain`` (gain). Every prompt weighs the same within its source and every
source the same overall, as in irt_fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.lab.irt_data import F64, I64
from gateway.lab.irt_fit import F32, L2, Design, make_design, prompt_weights

DESIGNS = ("ridge-x", "gain", "gbt", "gbt-gain")
PCS = 16
GBT_PARAMS: dict[str, Any] = {
    "max_iter": 150, "learning_rate": 0.05, "max_leaf_nodes": 15, "min_samples_leaf": 50,
    "l2_regularization": 1.0, "random_state": 0,
}  # fmt: skip


def residual_target(rows: I64, cols: I64, y: F64, n: int, m: int) -> F64:
    mean_m = np.bincount(cols, weights=y, minlength=m) / np.maximum(np.bincount(cols, minlength=m), 1)
    cnt = np.maximum(np.bincount(rows, minlength=n), 1)
    return np.asarray(np.bincount(rows, weights=y - mean_m[cols], minlength=n) / cnt, dtype=np.float64)


def gain_target(rows: I64, cols: I64, y: F64, n: int, m: int, model_source: list[str]) -> F64:
    """Per prompt: mean over its models of (outcome - prompt mean) x z(model), z the model's
    logit accuracy standardised among the models of its source."""
    cnt_m = np.maximum(np.bincount(cols, minlength=m), 1)
    acc = np.clip(np.bincount(cols, weights=y, minlength=m) / cnt_m, 0.02, 0.98)
    logit = np.log(acc / (1.0 - acc))
    z = np.zeros(m)
    src = np.array(model_source)
    for s in set(model_source):
        sel = src == s
        sd = float(logit[sel].std())
        z[sel] = (logit[sel] - logit[sel].mean()) / (sd if sd > 1e-9 else 1.0)
    cnt = np.maximum(np.bincount(rows, minlength=n), 1)
    ybar = np.bincount(rows, weights=y, minlength=n) / cnt
    g = (y - ybar[rows]) * z[cols]
    return np.asarray(np.bincount(rows, weights=g, minlength=n) / cnt, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class DesignFit:
    family: str
    design: Design
    sign: float  # +1: the prediction is the score (gain); -1: minus it (residual success)
    w: F64 | None = None  # ridge
    pca_mean: F64 | None = None
    pca: F64 | None = None  # (384, PCS)
    trees: Any = None  # a fitted HistGradientBoostingRegressor

    def difficulty(self, emb: F32, xfeats: F64) -> F64:
        if self.w is not None:
            return np.asarray(self.sign * (self.design.x(emb, xfeats) @ self.w), dtype=np.float64)
        assert self.pca is not None and self.pca_mean is not None
        z = np.hstack([xfeats, (emb.astype(np.float64) - self.pca_mean) @ self.pca])
        return np.asarray(self.sign * self.trees.predict(z), dtype=np.float64)


def fit_design(
    family: str, emb: F32, xfeats: F64, source: list[str], rows: I64, cols: I64, y: F64,
    models: tuple[str, ...], *, l2: float = L2,
) -> DesignFit:  # fmt: skip
    """Fit one design on the prompts of ``emb``/``xfeats`` (features then traits)."""
    n, m = len(emb), len(models)
    if family in ("gain", "gbt-gain"):
        target = gain_target(rows, cols, y, n, m, [k.split("/", 1)[0] for k in models])
        sign = 1.0
    elif family in ("ridge-x", "gbt"):
        target = residual_target(rows, cols, y, n, m)
        sign = -1.0
    else:
        raise ValueError(f"unknown design {family!r}; known: {', '.join(DESIGNS)}")
    pw = np.bincount(rows, weights=prompt_weights(source, rows, n), minlength=n)
    design = make_design(xfeats)
    if family in ("ridge-x", "gain"):
        x = design.x(emb, xfeats)
        xw = x * pw[:, None]
        beta = np.linalg.solve(xw.T @ x + l2 * np.eye(x.shape[1]), xw.T @ target)
        return DesignFit(family, design, sign, w=np.asarray(beta, dtype=np.float64))
    from sklearn.ensemble import HistGradientBoostingRegressor  # type: ignore[import-untyped]

    e = emb.astype(np.float64)
    mu = e.mean(axis=0)
    _, _, vt = np.linalg.svd((e - mu)[:: max(1, n // 4000)], full_matrices=False)
    pca = np.asarray(vt[:PCS].T, dtype=np.float64)
    z = np.hstack([xfeats, (e - mu) @ pca])
    trees = HistGradientBoostingRegressor(**GBT_PARAMS).fit(z, target, sample_weight=pw * n)
    return DesignFit(family, design, sign, pca_mean=mu, pca=pca, trees=trees)
