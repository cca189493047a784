"""Is a cached question the same question as the lookup? A check beyond the cosine.

Two layers:

1. Hard rules that reject regardless of the score: the numbers differ ("17 * 23" vs
   "17 * 24"), the arithmetic operators differ, or one side is negated and the other not.
2. A small learned model: a logistic regression over cheap text features (cosine, length
   ratio, word overlap, differing capitalised tokens, question-word mismatch, ...) and the
   embedding interaction [u*v, |u-v|] of the two questions' vectors, trained on QQP by
   ``switchyard train semcache``; its weights (~800 numbers) ship as ``verifier_weights.json``.

A score costs some microseconds (one 768-dot product and a few set operations)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

WEIGHTS_PATH = Path(__file__).with_name("verifier_weights.json")
DIM = 384
Vector = npt.NDArray[np.float32]

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?![\d,])|\d+(?:\.\d+)?")
_OPERATOR = re.compile(r"(?<=[\s\d)])([+*/^%×÷=<>-])(?=[\s\d(])")
_NUMBER_WORDS = {
    "zero": "0", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
    "eighteen": "18", "nineteen": "19", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50",
    "sixty": "60", "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100",
    "thousand": "1000", "million": "1000000", "billion": "1000000000",
}  # fmt: skip
_OPERATOR_WORDS = {
    "plus": "+", "minus": "-", "times": "*", "multiplied": "*", "divided": "/", "over": "/",
    "squared": "^2", "cubed": "^3", "mod": "%", "modulo": "%",
}  # fmt: skip
_NEGATIONS = frozenset(
    {"not", "no", "never", "without", "nobody", "nothing", "none", "neither", "nor", "cannot"}
)
_QWORDS = ("what", "why", "how", "when", "where", "who", "whom", "whose", "which")
_STOP_WORDS = (
    "a an the is are was were be been being am do does did doing to of in on at for from by with "
    "and or but if so as it its this that these those i me my we our you your he she they them his her "
    "their what why how when where who which whom whose can could should would will shall may might must "
    "there here than then about into over under up down out off just also very much many more most "
    "some any all each every get got have has had"
)
_STOP = frozenset(_STOP_WORDS.split())

FEATURES = (
    "cosine", "cosine_sq", "char_len_ratio", "word_len_diff", "token_jaccard", "content_jaccard",
    "content_only_a", "content_only_b", "bigram_jaccard", "caps_diff", "qword_mismatch",
    "first_word_same", "last_content_same",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Text:
    """The parts of a text the features need, computed once per text."""

    raw: str
    words: tuple[str, ...]  # lowercase
    numbers: tuple[str, ...]  # sorted, normalised
    operators: tuple[str, ...]  # sorted
    negated: bool
    caps: frozenset[str]  # capitalised tokens after the first word, lowercased
    qword: str
    content: frozenset[str]


def analyse(text: str) -> Text:
    tokens = _WORD.findall(text)
    words = tuple(t.lower() for t in tokens)
    numbers = [n.replace(",", "") for n in _NUMBER.findall(text)]
    numbers += [_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS]
    operators = [o.replace("×", "*").replace("÷", "/") for o in _OPERATOR.findall(text)]
    operators += [_OPERATOR_WORDS[w] for w in words if w in _OPERATOR_WORDS]
    negated = any(w in _NEGATIONS or w.endswith("n't") for w in words)
    caps = frozenset(t.lower() for t in tokens[1:] if t[:1].isupper() and t.lower() not in _STOP)
    qword = next((w for w in words if w in _QWORDS), "")
    content = frozenset(w for w in words if w not in _STOP and w not in _NEGATIONS)
    return Text(text, words, tuple(sorted(numbers)), tuple(sorted(operators)), negated, caps, qword, content)


def hard_reject(a: Text, b: Text) -> str | None:
    """A reason the two texts can never share an answer, whatever their similarity."""
    if a.numbers != b.numbers:
        return "numbers"
    if a.operators != b.operators:
        return "operators"
    if a.negated != b.negated:
        return "negation"
    return None


def _jaccard(x: AbstractSet[object], y: AbstractSet[object]) -> float:
    union = len(x | y)
    return len(x & y) / union if union else 1.0


def features(a: Text, b: Text, cosine: float) -> list[float]:
    la, lb = len(a.raw), len(b.raw)
    bi_a = set(zip(a.words, a.words[1:], strict=False))
    bi_b = set(zip(b.words, b.words[1:], strict=False))
    last_a = next((w for w in reversed(a.words) if w in a.content), "")
    last_b = next((w for w in reversed(b.words) if w in b.content), "")
    return [
        cosine,
        cosine * cosine,
        min(la, lb) / max(la, lb, 1),
        math.log1p(abs(len(a.words) - len(b.words))),
        _jaccard(frozenset(a.words), frozenset(b.words)),
        _jaccard(a.content, b.content),
        math.log1p(len(a.content - b.content)),
        math.log1p(len(b.content - a.content)),
        _jaccard(bi_a, bi_b),
        math.log1p(len(a.caps ^ b.caps)),
        float(a.qword != b.qword),
        float(a.words[:1] == b.words[:1]),
        float(last_a == last_b),
    ]


EMB_SCALE = 10.0  # the pair-vector block [u*v, |u-v|] is multiplied by this before its weights


def pair_vector(u: Vector, v: Vector) -> Vector:
    """The embedding-interaction block of the features: [u*v, |u-v|] * EMB_SCALE (768 floats)."""
    out: Vector = np.concatenate([u * v, np.abs(u - v)]).astype(np.float32) * EMB_SCALE
    return out


@dataclass(frozen=True)
class Verifier:
    """Logistic regression over the standardised text features plus the pair-vector block.
    ``threshold`` is the default cut-off; ``min_cosine`` is the floor below which a
    candidate is not even scored."""

    weights: tuple[float, ...]  # one per FEATURES entry
    emb_weights: Vector  # 768: over pair_vector(query, cached)
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    threshold: float
    min_cosine: float
    meta: dict[str, Any]

    def probability(self, a: Text, b: Text, cosine: float, u: Vector, v: Vector) -> float:
        """P(same question) from the model alone (no hard rules)."""
        z = self.bias + float(self.emb_weights @ pair_vector(u, v))
        for x, w, m, s in zip(features(a, b, cosine), self.weights, self.mean, self.scale, strict=True):
            z += w * (x - m) / s
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))

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
            return 1.0  # the same words in the same order (case, spacing, punctuation aside)
        cosine = float(u @ v)
        if cosine < self.min_cosine:
            return 0.0
        return self.probability(a, b, cosine, u, v)

    def to_json(self) -> dict[str, Any]:
        return {
            "features": list(FEATURES), "weights": [round(w, 6) for w in self.weights],
            "emb_scale": EMB_SCALE, "emb_weights": [round(float(w), 5) for w in self.emb_weights],
            "bias": self.bias, "mean": list(self.mean), "scale": list(self.scale),
            "threshold": self.threshold, "min_cosine": self.min_cosine, "meta": self.meta,
        }  # fmt: skip


def verifier_from_json(data: dict[str, Any]) -> Verifier:
    if list(data.get("features", [])) != list(FEATURES) or data.get("emb_scale") != EMB_SCALE:
        raise ValueError(
            "verifier weights were trained on other features; retrain: switchyard train semcache"
        )
    emb = np.asarray(data["emb_weights"], dtype=np.float32)
    if emb.shape != (2 * DIM,):
        raise ValueError(f"verifier emb_weights must have {2 * DIM} values")
    return Verifier(
        tuple(float(w) for w in data["weights"]), emb, float(data["bias"]),
        tuple(float(m) for m in data["mean"]), tuple(float(s) or 1.0 for s in data["scale"]),
        float(data["threshold"]), float(data["min_cosine"]), dict(data.get("meta", {})),
    )  # fmt: skip


def load_verifier(path: Path | None = None) -> Verifier:
    return verifier_from_json(json.loads((path or WEIGHTS_PATH).read_text()))
