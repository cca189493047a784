"""`switchyard train router`: read labelled files, embed, choose the L2 strength by grouped
cross-validation (a fold never shares a task/domain with its training data, so the choice
rewards generalising to unseen tasks), fit on everything, calibrate on out-of-fold scores."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.lab.router_fit import (
    Example,
    Fitted,
    calibration_curve,
    correctness,
    feature_table,
    fit_router,
    group_folds,
)
from gateway.lab.router_metrics import router_metrics
from gateway.routing.classifier import EMBEDDER_DIM, EMBEDDER_NAME, FORMAT
from gateway.routing.features import FEATURE_NAMES

L2_GRID = (1e-3, 3e-3, 1e-2)
ALPHA = 0.75  # see RouterModel: chosen on MMLU-domain and GSM8K hold-outs (load_tests/README.md)
LENGTH_PRIOR = 0.5
FOLDS = 5
EncodeFn = Callable[[list[str]], npt.NDArray[np.float32]]


def read_examples(files: list[Path]) -> list[Example]:
    out: list[Example] = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                out.append(
                    Example(
                        prompt=str(row["prompt"]),
                        weak_correct=bool(row["weak_correct"]),
                        strong_correct=bool(row["strong_correct"]),
                        group=f"{path.stem}/{row.get('domain') or ''}",
                    )
                )
            except KeyError as exc:
                raise ValueError(f"{path}:{i}: missing field {exc}") from None
    if len(out) < 50:
        raise ValueError(f"only {len(out)} labelled prompts; need at least 50 to train")
    return out


def grouped_cv(
    emb: npt.NDArray[np.float32],
    feats: npt.NDArray[np.float64],
    weak: npt.NDArray[np.float64],
    strong: npt.NDArray[np.float64],
    folds: list[npt.NDArray[np.int64]],
    l2: float,
    alpha: float = ALPHA,
    length_prior: float = LENGTH_PRIOR,
) -> tuple[npt.NDArray[np.float64], list[float]]:
    """Out-of-fold scores (each fold scored by a router fitted on the others) and each fold's APGR."""
    oof = np.zeros(len(weak))
    fold_apgr = []
    for idx in folds:
        train = np.setdiff1d(np.arange(len(weak)), idx)
        model = fit_router(emb[train], feats[train], weak[train], strong[train], l2, alpha, length_prior)
        oof[idx] = model.scores(emb[idx], feats[idx])
        fold_apgr.append(router_metrics(oof[idx], weak[idx], strong[idx]).apgr)
    return oof, fold_apgr


def train_router(
    files: list[Path],
    encode: EncodeFn,
    *,
    embedder_name: str,
    seed: int,
    l2: float | None,
    alpha: float = ALPHA,
    length_prior: float = LENGTH_PRIOR,
    command: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    examples = read_examples(files)
    log(f"{len(examples)} labelled prompts from {len(files)} file(s); embedding ...")
    emb = encode([e.prompt for e in examples])
    feats = feature_table(examples)
    weak, strong = correctness(examples)
    groups = [e.group for e in examples]
    folds = group_folds(groups, FOLDS, seed)
    cv: dict[str, Any] = {}
    best: tuple[float, float, npt.NDArray[np.float64]] | None = None
    for lam in (l2,) if l2 is not None else L2_GRID:
        oof, fold_apgr = grouped_cv(emb, feats, weak, strong, folds, lam, alpha, length_prior)
        mean = float(np.mean(fold_apgr))
        cv[f"{lam:g}"] = round(mean, 4)
        log(f"  l2={lam:g}: held-out-group APGR per fold {[round(a, 3) for a in fold_apgr]} mean {mean:.4f}")
        if best is None or mean > best[0]:
            best = (mean, lam, oof.copy())
    assert best is not None
    _, lam, oof = best
    final = fit_router(emb, feats, weak, strong, lam, alpha, length_prior)
    pooled = router_metrics(oof, weak, strong)
    log(f"chose l2={lam:g}; pooled out-of-fold APGR {pooled.apgr:.4f} CPT50 {pooled.cpt50:.1f}%")
    d, n_emb = final.strong.design, emb.shape[1]

    def head(f: Fitted) -> dict[str, Any]:
        return {"w_emb": _r(f.w[:n_emb]), "w_feat": _r(f.w[n_emb:]), "bias": round(f.b, 6)}

    return {
        "format": FORMAT,
        "embedder": {"name": EMBEDDER_NAME, "dim": EMBEDDER_DIM, "trained_with": embedder_name},
        "model": "two logistic heads on [embedding, standardised text features]: "
        "raw = alpha*P(strong correct) - P(weak correct) + length_coef*z(log chars); "
        "score = sigmoid((raw - center)/scale)",
        "features": list(FEATURE_NAMES),
        "feature_mean": _r(d.mean),
        "feature_std": _r(d.std),
        "heads": {"strong": head(final.strong), "weak": head(final.weak)},
        "alpha": alpha,
        "length_coef": round(final.length_coef, 6),
        "center": round(final.center, 6),
        "scale": round(final.scale, 6),
        "calibration": calibration_curve(oof, weak, strong),
        "calibration_source": f"out-of-fold scores, {FOLDS} folds grouped by file/domain",
        "training": {
            "command": command,
            "seed": seed,
            "l2": lam,
            "alpha": alpha,
            "length_prior": length_prior,
            "cv_mean_fold_apgr": cv,
            "n": len(examples),
            "files": [{"name": p.name, "sha256": _sha(p)} for p in files],
            "oof_apgr": round(pooled.apgr, 4),
            "oof_cpt50": round(pooled.cpt50, 2),
            "oof_cpt80": round(pooled.cpt80, 2),
        },
    }


def _r(v: npt.NDArray[np.float64]) -> list[float]:
    return [round(float(x), 6) for x in v]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
