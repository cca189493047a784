"""`switchyard train router --irt`: fit the difficulty model (``irt`` family of
gateway.lab.irt_fit) on every labelled file, with the abilities of every model in them, and
write ``gateway/routing/difficulty_weights.json`` (format ``switchyard-difficulty/1``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.lab.irt_data import encode_by_file, read_table
from gateway.lab.irt_eval import LENGTH_PRIOR
from gateway.lab.irt_fit import EMB_SCALE, F32, L2, fit_family
from gateway.routing.classifier import EMBEDDER_DIM, EMBEDDER_NAME
from gateway.routing.features import FEATURE_NAMES, feature_matrix
from gateway.routing.quality import FORMAT

EncodeFn = Callable[[list[str]], F32]
MAP_SOURCE = "mmlu-pro"  # the source whose accuracies map a public benchmark score to an ability


def train_difficulty(
    files: list[Path], encode: EncodeFn, *, embedder_name: str, seed: int, command: str,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    table = read_table(files)
    log(f"{len(table.prompts)} prompts, {len(table.models)} models, {len(table.y)} outcomes; embedding ...")
    emb = encode_by_file(table, encode)
    feats = feature_matrix(table.prompts)
    fit = fit_family(
        "irt", emb, feats, table.source, table.rows, table.cols, table.y, tuple(table.models), seed=seed
    )
    d = fit.difficulty(emb, feats)
    n_emb = emb.shape[1]
    abilities = {m: round(float(a), 4) for m, a in zip(table.models, fit.abilities, strict=True)}
    return {
        "format": FORMAT,
        "embedder": {"name": EMBEDDER_NAME, "dim": EMBEDDER_DIM, "trained_with": embedder_name},
        "model": "P(model m answers prompt p well) = sigmoid(ability_m - d_p); "
        "d_p = emb_scale * w_emb . embedding + w_feat . standardised text features",
        "features": list(FEATURE_NAMES),
        "feature_mean": _r(fit.design.mean),
        "feature_std": _r(fit.design.std),
        "emb_scale": EMB_SCALE,
        "w_emb": _r(fit.w[:n_emb]),
        "w_feat": _r(fit.w[n_emb:]),
        "d_mean": round(float(d.mean()), 6),
        "d_std": round(float(d.std()), 6),
        "length_prior": LENGTH_PRIOR,
        "abilities": abilities,
        "ability_from_mmlu_pro": _ability_map(table, fit.abilities),
        "training": {
            "command": command,
            "seed": seed,
            "l2": L2,
            "n_prompts": len(table.prompts),
            "n_outcomes": len(table.y),
            "files": [{"name": p.name, "sha256": _sha(p)} for p in files],
        },
    }


def _ability_map(table: Any, abilities: np.ndarray) -> dict[str, Any]:
    """Least squares ability ~ intercept + slope * logit(accuracy) over the MMLU-Pro models."""
    src = np.array(table.source)
    acc, ab = [], []
    for j, name in enumerate(table.models):
        if name.startswith(f"{MAP_SOURCE}/"):
            sel = (table.cols == j) & (src[table.rows] == MAP_SOURCE)
            p = float(np.clip(table.y[sel].mean(), 0.01, 0.99))
            acc.append(np.log(p / (1 - p)))
            ab.append(float(abilities[j]))
    if len(acc) < 2:
        return {"intercept": 0.0, "slope": 1.0, "fitted_on": "none (no MMLU-Pro models in the data)"}
    slope, intercept = np.polyfit(np.array(acc), np.array(ab), 1)
    return {"intercept": round(float(intercept), 6), "slope": round(float(slope), 6),
            "fitted_on": f"{len(acc)} MMLU-Pro models: ability ~ logit(accuracy on these rows)"}  # fmt: skip


def _r(v: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in v]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
