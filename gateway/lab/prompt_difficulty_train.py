"""`switchyard train router --prompt-difficulty`: fit the ``ridge-x`` design
(gateway.lab.difficulty_designs) on every labelled file, learn its length weight by leaving
each source out in turn (gateway.lab.irt_eval.learn_length_weight), and write
``gateway/routing/prompt_difficulty.json`` (format ``switchyard-prompt-difficulty/1``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.lab.difficulty_designs import fit_design
from gateway.lab.irt_data import dense, encode_by_file, read_table
from gateway.lab.irt_eval import Data, Fits, choose_pairs, learn_length_weight
from gateway.lab.irt_fit import EMB_SCALE, F32, L2
from gateway.routing.classifier import EMBEDDER_DIM, EMBEDDER_NAME
from gateway.routing.features import FEATURE_NAMES, feature_matrix
from gateway.routing.prompt_difficulty import FORMAT
from gateway.routing.prompt_traits import TRAIT_NAMES, trait_matrix

DESIGN = "ridge-x"


def train_prompt_difficulty(
    files: list[Path], encode: Callable[[list[str]], F32], *, embedder_name: str, command: str,
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    table = read_table(files)
    log(f"{len(table.prompts)} prompts, {len(table.models)} models, {len(table.y)} outcomes; embedding ...")
    emb = encode_by_file(table, encode)
    feats = feature_matrix(table.prompts)
    xfeats = np.hstack([feats, trait_matrix(table.prompts)])
    y = dense(table)
    data = Data(table, emb, feats, xfeats, y, choose_pairs(table, y), 0)
    everything = np.ones(len(table.prompts), dtype=bool)
    fits: Fits = {}
    weight = learn_length_weight(DESIGN, data, everything, fits)
    log(f"length weight {weight:g} (learnt leaving each source out)")
    fit = fit_design(DESIGN, emb, xfeats, table.source, table.rows, table.cols, table.y, tuple(table.models))
    assert fit.w is not None
    d = fit.difficulty(emb, xfeats)
    n_emb = emb.shape[1]
    return {
        "format": FORMAT,
        "embedder": {"name": EMBEDDER_NAME, "dim": EMBEDDER_DIM, "trained_with": embedder_name},
        "model": "score = sigmoid((d - d_mean) / d_std + length_weight * z(log chars)); d = sign * "
        "(emb_scale * w_emb . embedding + w_feat . standardised features and traits)",
        "design": f"{DESIGN}+lenfit",
        "features": [*FEATURE_NAMES, *TRAIT_NAMES],
        "feature_mean": _r(fit.design.mean),
        "feature_std": _r(fit.design.std),
        "emb_scale": EMB_SCALE,
        "w_emb": _r(fit.w[:n_emb]),
        "w_feat": _r(fit.w[n_emb:]),
        "sign": fit.sign,
        "d_mean": round(float(d.mean()), 6),
        "d_std": round(float(d.std()), 6),
        "length_weight": weight,
        "training": {
            "command": command,
            "l2": L2,
            "n_prompts": len(table.prompts),
            "n_outcomes": len(table.y),
            "files": [{"name": p.name, "sha256": _sha(p)} for p in files],
        },
    }


def _r(v: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in v]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
