"""Train the semantic-cache verifier: ``switchyard train semcache --pairs FILE.jsonl``.

Rows are ``{"text_a", "text_b", "label"}`` (1 = same question). The split is deterministic:
a pair is held out when ``sha256(text_a + "\\x1f" + text_b)`` falls in the last fifth, so the
evaluation (``switchyard eval semcache --split heldout``) never sees a training pair.

Only pairs a lookup would score are training candidates (they pass the hard rules and the
cosine floor and are not the same words). The model is an ensemble of ``members`` MLPs
(scikit-learn, one ReLU layer, L2 ``alpha``, early stopping) on ``verifier.model_input``.
The threshold never looks at held-out pairs: the training part is cut into 5 validation
folds (a second hash), every training pair gets an out-of-fold score from an ensemble fitted
on the other 4 folds (the same-words pairs score 1, rejected ones 0, as at lookup time),
and the shipped threshold is the lowest one whose out-of-fold precision reaches
``target_precision``. The shipped weights are then fitted on all training candidates."""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache.embedder import Embedder
from gateway.cache.verifier import INPUT_DIM, Verifier, analyse, hard_reject, model_input

HELDOUT_BUCKETS = 5  # 1 in 5 pairs is held out
VAL_FOLDS = 5
F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


def is_heldout(text_a: str, text_b: str) -> bool:
    digest = hashlib.sha256(f"{text_a}\x1f{text_b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_BUCKETS == 0


def val_fold(text_a: str, text_b: str) -> int:
    """The validation fold of a training pair (independent of the held-out hash)."""
    digest = hashlib.sha256(f"val\x1f{text_a}\x1f{text_b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % VAL_FOLDS


def read_pairs(path: Path, split: str = "all") -> list[tuple[str, str, int]]:
    """Pairs from a JSONL file; ``split``: all | train | heldout."""
    rows: list[tuple[str, str, int]] = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                a, b, label = str(row["text_a"]), str(row["text_b"]), int(row["label"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: need text_a, text_b, label ({exc})") from None
            if split == "all" or (split == "heldout") == is_heldout(a, b):
                rows.append((a, b, label))
    return rows


def pair_vectors(embedder: Embedder, pairs: Sequence[tuple[str, str, int]]) -> tuple[F32, F32]:
    """The (n, 384) vectors of every text_a and every text_b (each distinct text embedded once)."""
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    index = {t: i for i, t in enumerate(texts)}
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    # the cache keeps fp16 vectors: train on what lookups will see
    vecs = vecs.astype(np.float16).astype(np.float32)
    return vecs[[index[a] for a, _, _ in pairs]], vecs[[index[b] for _, b, _ in pairs]]


def pick_threshold(scores: F64, labels: F64, target: float) -> float:
    """The lowest threshold at which the precision of all hits above it is still >= target
    (counting from 50 hits on, so that a lucky handful at the top does not decide)."""
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order]
    precision = np.cumsum(y) / np.arange(1, len(y) + 1)
    good = np.nonzero(precision >= target)[0]
    good = good[good >= min(49, len(s) - 1)]
    return float(s[good.max()] if len(good) else s[0] + 1e-6)


def fit_ensemble(
    x: F64, y: F64, *, members: int = 3, hidden: int = 64, alpha: float = 3.0, seed: int = 0
) -> tuple[F32, F32, F32, F32]:
    """(w1, b1, w2, b2) of ``members`` MLPs on standardised ``x``, the standardisation folded
    into w1/b1 so that inference takes raw model inputs."""
    from sklearn.exceptions import ConvergenceWarning  # type: ignore[import-untyped]
    from sklearn.neural_network import MLPClassifier  # type: ignore[import-untyped]

    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    xs = (x - mean) / scale
    w1s, b1s, w2s, b2s = [], [], [], []
    for m in range(members):
        clf = MLPClassifier((hidden,), alpha=alpha, max_iter=200, early_stopping=True, random_state=seed + m)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(xs, y)
        w, b = clf.coefs_[0], clf.intercepts_[0]
        w1s.append(w / scale[:, None])
        b1s.append(b - (mean / scale) @ w)
        w2s.append(clf.coefs_[1][:, 0])
        b2s.append(clf.intercepts_[1][0])
    f32 = np.float32
    return (
        np.hstack(w1s).astype(f32), np.concatenate(b1s).astype(f32),
        np.concatenate(w2s).astype(f32), np.asarray(b2s, dtype=f32),
    )  # fmt: skip


def train(
    pairs_path: Path,
    embedder: Embedder,
    *,
    min_cosine: float = 0.7,
    target_precision: float = 0.95,
    members: int = 3,
) -> tuple[Verifier, dict[str, Any]]:
    started = time.time()
    pairs = read_pairs(pairs_path, "train")
    va, vb = pair_vectors(embedder, pairs)
    rows, labels, folds, fixed = [], [], [], []  # fixed: 1.0 same words, 0.0 never scored, nan model
    for (a, b, label), u, v in zip(pairs, va, vb, strict=True):
        ta, tb = analyse(a), analyse(b)
        cosine = float(u @ v)
        labels.append(float(label))
        folds.append(val_fold(a, b))
        if hard_reject(ta, tb) is not None or (ta.words != tb.words and cosine < min_cosine):
            fixed.append(0.0)
        elif ta.words == tb.words:
            fixed.append(1.0)
        else:
            fixed.append(np.nan)
            rows.append(model_input(ta, tb, cosine, u, v))
    y_all, fold_all, score = np.asarray(labels), np.asarray(folds), np.asarray(fixed)
    cand = np.isnan(score)
    x = np.asarray(rows, dtype=np.float64).reshape(-1, INPUT_DIM)
    y, fold = y_all[cand], fold_all[cand]
    oof = np.zeros(len(y))
    for k in range(VAL_FOLDS):  # out-of-fold scores: the threshold never sees its own fit
        part = Verifier(*fit_ensemble(x[fold != k], y[fold != k], members=members), 0.5, min_cosine)
        oof[fold == k] = part.probabilities(x[fold == k].astype(np.float32))
    score[cand] = oof
    threshold = pick_threshold(score, y_all, target_precision)
    hits = score >= threshold
    backend = "onnx" if "onnx" in embedder.name else "torch"
    meta = {
        "model": f"{members} x MLP(64 ReLU, alpha 3.0, early stopping) on lexical features +"
        " [u*v, |u-v|, u+v]",
        "embedder": embedder.name,
        "trained_on": pairs_path.name,
        "split": f"train = pairs with sha256(text_a + '\\x1f' + text_b) % {HELDOUT_BUCKETS} != 0",
        "threshold_from": f"{VAL_FOLDS}-fold out-of-fold scores on the train split",
        "train_pairs": len(pairs),
        "candidates": int(cand.sum()),
        "target_precision": target_precision,
        "oof_precision": round(float(y_all[hits].mean()), 4) if hits.any() else None,
        "oof_recall": round(float(y_all[hits].sum() / max(1.0, y_all.sum())), 4),
        "command": f"switchyard train semcache --pairs {pairs_path.name} --embedder {backend}"
        f" --target-precision {target_precision}",
    }
    w1, b1, w2, b2 = fit_ensemble(x, y, members=members)
    meta["seconds"] = round(time.time() - started, 1)
    return Verifier(w1, b1, w2, b2, round(threshold, 4), min_cosine, meta), meta
