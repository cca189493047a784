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
from gateway.cache.verifier import FEATURES, Verifier, analyse, features, hard_reject, pair_vector

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


def pair_vectors(
    embedder: Embedder, pairs: Sequence[tuple[str, str, int]]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The (n, 384) vectors of every text_a and every text_b (each distinct text embedded once)."""
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    index = {t: i for i, t in enumerate(texts)}
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    # the cache keeps fp16 vectors: train on what lookups will see
    vecs = vecs.astype(np.float16).astype(np.float32)
    return vecs[[index[a] for a, _, _ in pairs]], vecs[[index[b] for _, b, _ in pairs]]


def fit_logistic(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], l2: float = 3.0, iters: int = 30
) -> tuple[npt.NDArray[np.float64], float]:
    """Weights and bias of a logistic regression with penalty ``l2/2 * |w|^2`` (Newton-Raphson)."""
    n, d = x.shape
    xb = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2)
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
    """The lowest threshold at which the precision of all hits above it is still >= target
    (counting from 50 hits on, so that a lucky handful at the top does not decide)."""
    order = np.argsort(-scores)
    s, y = scores[order], labels[order]
    precision = np.cumsum(y) / np.arange(1, len(y) + 1)
    good = np.nonzero(precision >= target)[0]
    good = good[good >= min(49, len(s) - 1)]
    return float(s[good.max()] if len(good) else s[0] + 1e-6)


def train(
    pairs_path: Path, embedder: Embedder, *, min_cosine: float = 0.7, target_precision: float = 0.93
) -> tuple[Verifier, dict[str, Any]]:
    started = time.time()
    pairs = read_pairs(pairs_path, "train")
    va, vb = pair_vectors(embedder, pairs)
    hand, inter, labels = [], [], []
    for (a, b, label), u, v in zip(pairs, va, vb, strict=True):
        ta, tb = analyse(a), analyse(b)
        cosine = float(u @ v)
        if cosine < min_cosine or hard_reject(ta, tb) is not None:
            continue  # never scored at lookup time either
        hand.append(features(ta, tb, cosine))
        inter.append(pair_vector(u, v))
        labels.append(float(label))
    xh = np.asarray(hand, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    mean, scale = xh.mean(axis=0), xh.std(axis=0)
    scale[scale == 0] = 1.0
    x = np.hstack([(xh - mean) / scale, np.asarray(inter, dtype=np.float64)])
    w, bias = fit_logistic(x, y)
    scores = 1.0 / (1.0 + np.exp(-(x @ w + bias)))
    threshold = pick_threshold(scores, y, target_precision)
    nh = len(FEATURES)
    backend = "onnx" if "onnx" in embedder.name else "torch"
    meta = {
        "model": "logistic regression (Newton, L2 3.0): standardised text features + [u*v, |u-v|]",
        "embedder": embedder.name,
        "trained_on": pairs_path.name,
        "split": f"train = pairs with sha256(text_a + '\\x1f' + text_b) % {HELDOUT_BUCKETS} != 0",
        "train_pairs": len(pairs),
        "candidates": len(labels),
        "target_precision": target_precision,
        "command": f"switchyard train semcache --pairs {pairs_path.name} --embedder {backend}"
        f" --target-precision {target_precision}",
        "seconds": round(time.time() - started, 1),
    }
    verifier = Verifier(
        tuple(float(v) for v in w[:nh]), w[nh:].astype(np.float32), bias,
        tuple(float(v) for v in mean), tuple(float(v) for v in scale),
        round(threshold, 4), min_cosine, meta,
    )  # fmt: skip
    return verifier, meta
