"""`switchyard train router --cross-task`: how the training recipe does on tasks it never saw.

The issue's router target is about "held-out prompts of other tasks", so the honest check
trains without a task and scores it:

- leave one file out: each data file (a task: MMLU, GSM8K, ...) is scored by a router fitted
  on the other files only (needs two files or more);
- held-out domains: inside each file with at least ``FOLDS`` domains (MMLU's subjects), the
  domains are split into ``FOLDS`` groups; each group is scored by a router fitted on every
  other row (the other domains and the other files). Pooled over the folds, and the mean of
  the per-fold APGR.

Beside the recipe (``fit_router`` with the shipped L2 / alpha / length prior), every split
shows the prompt-length baseline (longer = send to the strong model), which the issue names
as the bar a router must clearly beat; random routing scores ~0.5."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.lab.router_fit import F32, F64, LOG_CHARS, fit_router, group_folds
from gateway.lab.router_metrics import router_metrics

FOLDS = 5


@dataclass(frozen=True, slots=True)
class SplitResult:
    split: str
    n: int
    apgr: float
    cpt50: float
    length_apgr: float
    length_cpt50: float
    fold_apgr_mean: float | None = None


def cross_task(
    emb: F32,
    feats: F64,
    weak: F64,
    strong: F64,
    groups: list[str],
    *,
    l2: float,
    alpha: float,
    length_prior: float,
    seed: int = 0,
) -> list[SplitResult]:
    files = np.array([g.split("/", 1)[0] for g in groups])
    out: list[SplitResult] = []

    def scored(test: npt.NDArray[np.bool_]) -> F64:
        model = fit_router(emb[~test], feats[~test], weak[~test], strong[~test], l2, alpha, length_prior)
        return model.scores(emb[test], feats[test])

    def result(name: str, idx: npt.NDArray[np.bool_], scores: F64, folds: list[float] | None) -> SplitResult:
        m = router_metrics(scores, weak[idx], strong[idx])
        base = router_metrics(feats[idx, LOG_CHARS], weak[idx], strong[idx])
        finite = [a for a in folds or () if np.isfinite(a)]  # a fold of one outcome has no APGR
        mean = round(float(np.mean(finite)), 4) if finite else None
        return SplitResult(
            name, int(idx.sum()), round(m.apgr, 4), round(m.cpt50, 2), round(base.apgr, 4),
            round(base.cpt50, 2), mean,
        )  # fmt: skip

    names = sorted(set(files.tolist()))
    if len(names) >= 2:
        for name in names:
            test = files == name
            out.append(result(f"{name} (trained on the other files)", test, scored(test), None))
    for name in names:
        rows = np.flatnonzero(files == name)
        domains = [groups[i] for i in rows]
        if len(set(domains)) < FOLDS:
            continue
        pooled = np.zeros(len(rows))
        per_fold = []
        for fold in group_folds(domains, FOLDS, seed):
            test = np.zeros(len(groups), dtype=bool)
            test[rows[fold]] = True
            pooled[fold] = scored(test)
            per_fold.append(router_metrics(pooled[fold], weak[rows[fold]], strong[rows[fold]]).apgr)
        idx = files == name
        out.append(result(f"{name}: held-out domains, {FOLDS} folds pooled", idx, pooled, per_fold))
    return out


def table(results: list[SplitResult]) -> str:
    lines = [
        "| split | n | APGR | CPT(50%) | prompt length: APGR | CPT(50%) | mean APGR per fold |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        fold = f"{r.fold_apgr_mean:.3f}" if r.fold_apgr_mean is not None else ""
        lines.append(
            f"| {r.split} | {r.n} | {r.apgr:.3f} | {r.cpt50:.1f}% | {r.length_apgr:.3f} |"
            f" {r.length_cpt50:.1f}% | {fold} |"
        )
    return "\n".join(lines)
