"""Model families for prompt difficulty, each fitted on a sparse prompt x model outcome table
(gateway.lab.irt_data) over [embedding, standardised text features]:

- ``irt``:  P(m ok on p) = sigmoid(a_m - d_p), d_p = w . x_p (item response theory, one
  dimension; the difficulty is a linear function of the prompt, the abilities are free);
- ``mirt``: P = sigmoid(a_m + theta_m . (V x_p) - w . x_p) (K skill dimensions; the score of
  a prompt for an unknown model is its mean-ability difficulty w . x_p - mean theta . V x_p);
- ``ridge``: ridge regression of the prompt's mean residual success (outcome minus the
  model's mean) on x_p; difficulty = minus the prediction (no joint ability fit);
- ``knn``: difficulty = minus the mean residual success of the 32 nearest training prompts
  (cosine over the embedding).

Every prompt weighs the same within its source and every source the same overall, so the
14,000 MMLU rows of two models do not drown the 29-model MMLU-Pro table. Deterministic:
L-BFGS from fixed starts (scipy, offline only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gateway.lab.irt_data import F64, I64

F32 = npt.NDArray[np.float32]
FAMILIES = ("irt", "mirt", "ridge", "knn")
EMB_SCALE = 8.0  # unit-norm 384-d vectors: components ~0.05; scaled to the features' range
L2 = 3e-3
SKILLS = 3
KNN = 32


@dataclass(frozen=True, slots=True)
class Design:
    mean: F64
    std: F64

    def x(self, emb: F32, feats: F64) -> F64:
        return np.hstack([emb.astype(np.float64) * EMB_SCALE, (feats - self.mean) / self.std])


def make_design(feats: F64) -> Design:
    std = feats.std(axis=0)
    std[std < 1e-6] = 1.0
    return Design(feats.mean(axis=0), std)


@dataclass(frozen=True, slots=True)
class Fit:
    family: str
    design: Design
    w: F64  # difficulty weights over the design (irt, mirt, ridge)
    abilities: F64  # per training model (irt, mirt); empty for ridge/knn
    models: tuple[str, ...]
    v: F64 | None = None  # mirt: (D, K) skill projection
    theta: F64 | None = None  # mirt: (M, K)
    knn_x: F32 | None = field(default=None, repr=False)
    knn_t: F64 | None = field(default=None, repr=False)

    def difficulty(self, emb: F32, feats: F64) -> F64:
        if self.family == "knn":
            assert self.knn_x is not None and self.knn_t is not None
            sims = emb.astype(np.float32) @ self.knn_x.T
            top = np.argpartition(-sims, KNN - 1, axis=1)[:, :KNN]
            return np.asarray(-self.knn_t[top].mean(axis=1), dtype=np.float64)
        x = self.design.x(emb, feats)
        d = x @ self.w
        if self.family == "mirt":
            assert self.v is not None and self.theta is not None
            d = d - (x @ self.v) @ self.theta.mean(axis=0)
        return np.asarray(d, dtype=np.float64)

    def logits(self, emb: F32, feats: F64, model_ix: I64) -> F64:
        """(prompts, models) logit of success of the given training models."""
        x = self.design.x(emb, feats)
        base = self.abilities[model_ix][None, :] - (x @ self.w)[:, None]
        if self.family == "mirt":
            assert self.v is not None and self.theta is not None
            base = base + (x @ self.v) @ self.theta[model_ix].T
        return np.asarray(base, dtype=np.float64)


def prompt_weights(source: list[str], rows: I64, n_prompts: int) -> F64:
    """Weight of each outcome: 1 / (outcomes of its prompt x prompts of its source)."""
    per_prompt = np.bincount(rows, minlength=n_prompts).astype(np.float64)
    src = np.array(source)
    size = {s: float((src == s).sum()) for s in set(source)}
    w_prompt = np.array([1.0 / size[s] for s in source]) / len(size)
    return np.asarray(w_prompt[rows] / np.maximum(per_prompt[rows], 1.0), dtype=np.float64)


def _bce_grad(z: F64, y: F64, wt: F64) -> tuple[float, F64]:
    p = 0.5 * (1.0 + np.tanh(0.5 * z))
    loss = float(np.sum(wt * (np.logaddexp(0.0, z) - y * z)))
    return loss, wt * (p - y)


def fit_family(
    family: str,
    emb: F32,
    feats: F64,
    source: list[str],
    rows: I64,
    cols: I64,
    y: F64,
    models: tuple[str, ...],
    *,
    l2: float = L2,
    seed: int = 0,
    maxiter: int = 300,
) -> Fit:
    """Fit one family on the prompts of ``emb``/``feats``; ``rows``/``cols``/``y`` index them."""
    from scipy.optimize import minimize  # type: ignore[import-untyped]

    design = make_design(feats)
    x = design.x(emb, feats)
    n, d = x.shape
    m = len(models)
    wt = prompt_weights(source, rows, n)
    if family in ("ridge", "knn"):
        resid = _residual_success(rows, cols, y, n, m)
        if family == "knn":
            return Fit(
                family, design, np.zeros(d), np.zeros(0), models, knn_x=emb.astype(np.float32), knn_t=resid
            )
        pw = np.bincount(rows, weights=wt, minlength=n)
        beta = np.linalg.solve((x * pw[:, None]).T @ x + l2 * np.eye(d), (x * pw[:, None]).T @ resid)
        return Fit(family, design, np.asarray(-beta, dtype=np.float64), np.zeros(0), models)
    k = SKILLS if family == "mirt" else 0
    rng = np.random.default_rng(seed)
    mean_y = np.bincount(cols, weights=y, minlength=m) / np.maximum(np.bincount(cols, minlength=m), 1)
    a0 = np.log(np.clip(mean_y, 0.02, 0.98) / (1 - np.clip(mean_y, 0.02, 0.98)))
    start = np.concatenate([np.zeros(d), a0, 0.01 * rng.standard_normal(d * k + m * k)])

    def unpack(theta: F64) -> tuple[F64, F64, F64, F64]:
        w, a = theta[:d], theta[d : d + m]
        v = theta[d + m : d + m + d * k].reshape(d, k)
        th = theta[d + m + d * k :].reshape(m, k)
        return w, a, v, th

    def objective(theta: F64) -> tuple[float, F64]:
        w, a, v, th = unpack(theta)
        diff = x @ w
        z = a[cols] - diff[rows]
        if k:
            s = x @ v  # (n, k) skills
            z = z + np.einsum("ij,ij->i", s[rows], th[cols])
        loss, g = _bce_grad(z, y, wt)
        gp = np.bincount(rows, weights=g, minlength=n)
        grad_w = -(x.T @ gp) + l2 * w
        grad_a = np.bincount(cols, weights=g, minlength=m)
        parts = [grad_w, grad_a]
        if k:
            gs = np.zeros((n, k))
            np.add.at(gs, rows, g[:, None] * th[cols])
            gth = np.zeros((m, k))
            np.add.at(gth, cols, g[:, None] * s[rows])
            parts += [(x.T @ gs + l2 * v).ravel(), (gth + l2 * th).ravel()]
            loss += 0.5 * l2 * float(np.sum(v * v) + np.sum(th * th))
        loss += 0.5 * l2 * float(w @ w)
        return loss, np.concatenate(parts)

    res = minimize(objective, start, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
    w, a, v, th = unpack(np.asarray(res.x, dtype=np.float64))
    if k:
        return Fit(family, design, w, a, models, v=v, theta=th)
    return Fit(family, design, w, a, models)


def _residual_success(rows: I64, cols: I64, y: F64, n: int, m: int) -> F64:
    """Per prompt: mean over its models of (outcome - that model's mean outcome)."""
    mean_m = np.bincount(cols, weights=y, minlength=m) / np.maximum(np.bincount(cols, minlength=m), 1)
    r = y - mean_m[cols]
    cnt = np.maximum(np.bincount(rows, minlength=n), 1)
    return np.asarray(np.bincount(rows, weights=r, minlength=n) / cnt, dtype=np.float64)
