"""Is a cached question the same question as the lookup? A check beyond the cosine.

Two layers:

1. Hard rules that reject regardless of the score (``verifier_text.hard_reject``): the
   numbers differ ("17 * 23" vs "17 * 24"), the arithmetic operators differ, one side is
   negated and the other not, a language token differs ("C" vs "C++"), or a word was swapped
   for its antonym ("positive" vs "negative effects").
2. A learned pair classifier: a small ensemble of one-hidden-layer MLPs over the lexical
   features (``verifier_text.FEATURES``) and the embedding block [u*v, |u-v|, u+v] of the two
   questions' vectors, trained on QQP by ``switchyard train semcache``
   (``gateway.lab.verifier_train``); weights ship as ``verifier_weights.npz`` (~1 MB, float32, numpy
   inference only). Input standardisation is folded into the first layer.

A score costs some tens of microseconds (one (1175 x 192) product and a few set operations)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache.verifier_text import FEATURES, Text, analyse, features, hard_reject, rule_key

__all__ = [
    "DIM", "FEATURES", "INPUT_DIM", "WEIGHTS_PATH", "Text", "Verifier", "analyse", "features",
    "hard_reject", "load_verifier", "model_input", "rule_key",
]  # fmt: skip

WEIGHTS_PATH = Path(__file__).with_name("verifier_weights.npz")
FORMAT = "mlp-ensemble-v2"
DIM = 384
INPUT_DIM = len(FEATURES) + 3 * DIM
Vector = npt.NDArray[np.float32]
Matrix = npt.NDArray[np.float32]


def model_input(a: Text, b: Text, cosine: float, u: Vector, v: Vector) -> Vector:
    """The classifier's input: lexical features, then u*v, |u-v|, u+v (symmetric in a, b
    except for the a/b-ordered lexical counts)."""
    lex = np.asarray(features(a, b, cosine), dtype=np.float32)
    return np.concatenate([lex, u * v, np.abs(u - v), u + v]).astype(np.float32)


@dataclass(frozen=True)
class Verifier:
    """``members`` MLPs with ``hidden`` ReLU units each, concatenated: w1 (INPUT_DIM, members *
    hidden) acts on the raw model input; the probability is the members' mean sigmoid.
    ``threshold`` is the default cut-off; ``min_cosine`` is the floor below which a candidate
    is not even scored."""

    w1: Matrix
    b1: Vector
    w2: Vector  # (members * hidden,)
    b2: Vector  # (members,)
    threshold: float
    min_cosine: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def members(self) -> int:
        return int(self.b2.shape[0])

    def probabilities(self, x: Matrix) -> npt.NDArray[np.float64]:
        """P(same question) for a batch of model inputs (n, INPUT_DIM)."""
        h = np.maximum(x @ self.w1 + self.b1, 0.0)
        z = (h * self.w2).reshape(len(x), self.members, -1).sum(axis=2) + self.b2
        p: npt.NDArray[np.float64] = (1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))).mean(axis=1)
        return p.astype(np.float64)

    def probability(self, a: Text, b: Text, cosine: float, u: Vector, v: Vector) -> float:
        """P(same question) from the model alone (no hard rules)."""
        h = np.maximum(model_input(a, b, cosine, u, v) @ self.w1 + self.b1, 0.0)
        z = (h * self.w2).reshape(self.members, -1).sum(axis=1) + self.b2
        return float(np.mean([1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, float(t))))) for t in z]))

    def reject_reason(self, a: Text, b: Text, cosine: float) -> str | None:
        """Why ``score`` is 0 for this pair (a hard rule or the cosine floor), else None."""
        reason = hard_reject(a, b)
        if reason is None and cosine < self.min_cosine:
            return "cosine"
        return reason

    def score(self, a: Text, b: Text, u: Vector, v: Vector) -> float:
        """The acceptance score in [0, 1] of query ``a`` (vector ``u``) against cached ``b``
        (vector ``v``): 0 for a hard reject or a cosine below the floor."""
        if hard_reject(a, b) is not None:
            return 0.0
        if a.words == b.words:
            return 1.0  # the same tokens in the same order (case, spacing, punctuation aside)
        cosine = float(u @ v)
        if cosine < self.min_cosine:
            return 0.0
        return self.probability(a, b, cosine, u, v)

    def save(self, path: Path) -> None:
        header = {
            "format": FORMAT, "features": list(FEATURES), "input_dim": INPUT_DIM,
            "threshold": self.threshold, "min_cosine": self.min_cosine, "meta": self.meta,
        }  # fmt: skip
        with path.open("wb") as fh:
            np.savez_compressed(
                fh, header=np.array(json.dumps(header)), w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2
            )


def load_verifier(path: Path | None = None) -> Verifier:
    with np.load(path or WEIGHTS_PATH, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        if header.get("format") != FORMAT or header.get("features") != list(FEATURES):
            raise ValueError(
                "verifier weights were trained on other features; retrain: switchyard train semcache"
            )
        w1 = np.asarray(data["w1"], dtype=np.float32)
        b1, w2, b2 = (np.asarray(data[k], dtype=np.float32) for k in ("b1", "w2", "b2"))
    if w1.shape != (INPUT_DIM, b1.shape[0]) or w2.shape != b1.shape or b1.shape[0] % max(1, len(b2)):
        raise ValueError(f"verifier weights have the wrong shapes: w1 {w1.shape}, b2 {b2.shape}")
    return Verifier(
        w1, b1, w2, b2, float(header["threshold"]), float(header["min_cosine"]), dict(header["meta"])
    )
