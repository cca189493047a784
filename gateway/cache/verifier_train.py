"""Train the semantic-cache verifier: ``switchyard train semcache --pairs FILE.jsonl``.

Rows are ``{"text_a", "text_b", "label"}`` (1 = same question). The split is deterministic:
a pair is held out when ``sha256(text_a + "\\x1f" + text_b)`` falls in the last fifth, so the
evaluation (``switchyard eval semcache --split heldout``) never sees a training pair.

The model is a logistic regression fitted with Newton's method (numpy only) on the pairs
that pass the hard rules and the cosine floor; the shipped threshold is the lowest one
whose precision on the training pairs reaches ``--target-precision``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache.embedder import Embedder
from gateway.cache.verifier import FEATURES, Verifier, analyse, features, hard_reject

HELDOUT_BUCKETS = 5  # 1 in 5 pairs is held out


def is_heldout(text_a: str, text_b: str) -> bool:
    digest = hashlib.sha256(f"{text_a}\x1f{text_b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_BUCKETS == 0


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


def pair_cosines(embedder: Embedder, pairs: Sequence[tuple[str, str, int]]) -> npt.NDArray[np.float32]:
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    index = {t: i for i, t in enumerate(texts)}
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    ia = np.array([index[a] for a, _, _ in pairs])
    ib = np.array([index[b] for _, b, _ in pairs])
    out: npt.NDArray[np.float32] = (vecs[ia] * vecs[ib]).sum(axis=1)
    return out


def fit_logistic(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], l2: float = 1e-3, iters: int = 30
) -> tuple[npt.NDArray[np.float64], float]:
    """Weights and bias of an L2-regularised logistic regression (Newton-Raphson)."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2 * n)
    reg[-1] = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(xb @ w, -50, 50)))
        grad = xb.T @ (p - y) + reg * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + np.diag(reg) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


def pick_threshold(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.float64], target: float) -> float:
    """The lowest threshold whose precision (over hits) is >= target on every cut above it."""
    order = np.argsort(-scores)
    s, y = scores[order], labels[order]
    precision = np.cumsum(y) / np.arange(1, len(y) + 1)
    ok = precision >= target
    # the deepest cut such that all shallower cuts (with enough hits) also meet the target
    bad = np.nonzero(~ok[50:])[0]
    last = (bad[0] + 50 - 1) if len(bad) else len(s) - 1
    return float(s[max(last, 0)])


def train(
    pairs_path: Path, embedder: Embedder, *, min_cosine: float = 0.75, target_precision: float = 0.965
) -> tuple[Verifier, dict[str, Any]]:
    started = time.time()
    pairs = read_pairs(pairs_path, "train")
    cos = pair_cosines(embedder, pairs)
    rows, labels, kept = [], [], 0
    for (a, b, label), c in zip(pairs, cos, strict=True):
        ta, tb = analyse(a), analyse(b)
        if c < min_cosine or hard_reject(ta, tb) is not None:
            continue
        kept += 1
        rows.append(features(ta, tb, float(c)))
        labels.append(float(label))
    x = np.asarray(rows, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    w, bias = fit_logistic((x - mean) / scale, y)
    scores = 1.0 / (1.0 + np.exp(-(((x - mean) / scale) @ w + bias)))
    threshold = pick_threshold(scores, y, target_precision)
    meta = {
        "model": "logistic regression (Newton, L2 1e-3) over standardised features",
        "embedder": embedder.name,
        "trained_on": pairs_path.name,
        "split": f"train = pairs with sha256(text_a + '\\x1f' + text_b) % {HELDOUT_BUCKETS} != 0",
        "train_pairs": len(pairs),
        "candidates": kept,
        "target_precision": target_precision,
        "command": f"switchyard train semcache --pairs {pairs_path.name} --embedder {embedder.name}",
        "seconds": round(time.time() - started, 1),
    }
    verifier = Verifier(
        tuple(float(v) for v in w), bias, tuple(float(v) for v in mean), tuple(float(v) for v in scale),
        round(threshold, 4), min_cosine, meta,
    )  # fmt: skip
    assert len(verifier.weights) == len(FEATURES)
    return verifier, meta
