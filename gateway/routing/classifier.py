"""The complexity classifier at inference: two logistic heads (will the strong / the weak
model answer correctly?) over the shared sentence embedding and cheap text features
(gateway.routing.features), combined with a prompt-length prior (see train.RouterModel).
Pure numpy; the embedding comes from the caller (the shared embedder), so scoring one prompt
costs two 400-wide dot products plus the text features.

The weights file (JSON) records the embedder it was trained on; loading refuses an embedder
of another name or dimension, so a score is never computed on vectors of the wrong space."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.core.errors import SwitchyardError
from gateway.routing.features import FEATURE_NAMES, feature_matrix, text_features

FORMAT: Final = "switchyard-router/1"
EMBEDDER_NAME: Final = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDER_DIM: Final = 384
SHIPPED_WEIGHTS: Final = Path(__file__).resolve().parent / "router_weights.json"

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
_LOG_CHARS: Final = FEATURE_NAMES.index("log_chars")


class ClassifierError(SwitchyardError, ValueError):
    """A weights file that cannot be used (unreadable, wrong format, wrong embedder)."""

    code = "invalid_classifier"


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    threshold: float
    strong_fraction: float  # expected share of prompts sent to the strong tier
    quality: float  # expected accuracy relative to always-strong (1.0 = strong quality)


class ComplexityClassifier:
    """score(embedding, text) -> probability-like score; higher = needs the strong model."""

    def __init__(self, doc: dict[str, Any], source: str) -> None:
        try:
            if doc.get("format") != FORMAT:
                raise ClassifierError(f"{source}: not a {FORMAT} weights file")
            emb = doc["embedder"]
            self.embedder_name: str = str(emb["name"])
            self.dim: int = int(emb["dim"])
            if tuple(doc["features"]) != FEATURE_NAMES:
                raise ClassifierError(f"{source}: trained on other text features than this version computes")
            mean = np.asarray(doc["feature_mean"], dtype=np.float64)
            std = np.asarray(doc["feature_std"], dtype=np.float64)
            # fold the standardisation into the weights: w . (f - mean) / std = (w / std) . f - c
            self._heads = []
            for name in ("strong", "weak"):
                h = doc["heads"][name]
                w_feat = np.asarray(h["w_feat"], dtype=np.float64) / std
                self._heads.append(
                    (
                        np.asarray(h["w_emb"], dtype=np.float64),
                        w_feat,
                        float(h["bias"]) - float(w_feat @ mean),
                    )
                )
            self._alpha = float(doc["alpha"])
            i = FEATURE_NAMES.index("log_chars")
            self._len_w = float(doc["length_coef"]) / float(std[i])
            self._len_b = -float(doc["length_coef"]) * float(mean[i]) / float(std[i])
            self._center, self._scale = float(doc["center"]), float(doc["scale"])
            self.calibration: tuple[CalibrationPoint, ...] = tuple(
                CalibrationPoint(float(p["threshold"]), float(p["strong_fraction"]), float(p["quality"]))
                for p in doc.get("calibration", [])
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ClassifierError):
                raise
            raise ClassifierError(f"{source}: malformed weights file ({exc!r})") from None
        for w_emb, w_feat, _ in self._heads:
            if w_emb.shape != (self.dim,) or w_feat.shape != (len(FEATURE_NAMES),):
                raise ClassifierError(f"{source}: weight shapes do not match the declared dimensions")
        if not self._scale > 0:
            raise ClassifierError(f"{source}: 'scale' must be positive")
        self.source = source

    @classmethod
    def load(cls, path: Path | None = None) -> ComplexityClassifier:
        path = path or SHIPPED_WEIGHTS
        return cls(read_weights(path, "router weights"), str(path))

    def check_embedder(self, name: str, dim: int) -> None:
        """Refuse vectors from an embedder the weights were not trained on (``check_trained_on``)."""
        check_trained_on("router weights", self.source, self.embedder_name, self.dim, name, dim)

    def score(self, embedding: F32, text: str) -> float:
        """Score of one prompt from its embedding (shape (dim,)) and its text: ``score_batch``'s
        arithmetic on one row to the bit (the same products, in the same shapes, and the same
        tanh), in Python floats between them. A request scores right after its model run,
        when the caches are cold and each numpy call counts: ~30 us less than ``_combine``."""
        if embedding.shape != (self.dim,):
            raise ClassifierError(f"embedding has shape {embedding.shape}, expected ({self.dim},)")
        feats = text_features(text)
        emb = embedding.astype(np.float64)[None, :]
        row = np.asarray(feats, dtype=np.float64)[None, :]
        (se, sf, sb), (we, wf, wb) = self._heads
        z_strong = float((emb @ se)[0]) + float((row @ sf)[0]) + sb
        z_weak = float((emb @ we)[0]) + float((row @ wf)[0]) + wb
        t_strong, t_weak = np.tanh(np.array([0.5 * z_strong, 0.5 * z_weak])).tolist()
        p_strong, p_weak = 0.5 * (1.0 + t_strong), 0.5 * (1.0 + t_weak)
        raw = self._alpha * p_strong - p_weak + (feats[_LOG_CHARS] * self._len_w + self._len_b)
        t_out = float(np.tanh(np.array([0.5 * ((raw - self._center) / self._scale)]))[0])
        return 0.5 * (1.0 + t_out)

    def score_batch(self, embeddings: F32, texts: list[str]) -> F64:
        if embeddings.shape != (len(texts), self.dim):
            raise ClassifierError(
                f"embeddings have shape {embeddings.shape}, expected ({len(texts)}, {self.dim})"
            )
        return self._combine(embeddings.astype(np.float64), feature_matrix(texts))

    def _combine(self, emb: F64, feats: F64) -> F64:
        (se, sf, sb), (we, wf, wb) = self._heads
        p_strong = _sigmoid(emb @ se + feats @ sf + sb)
        p_weak = _sigmoid(emb @ we + feats @ wf + wb)
        length = feats[:, _LOG_CHARS] * self._len_w + self._len_b
        raw = self._alpha * p_strong - p_weak + length
        return _sigmoid((raw - self._center) / self._scale)

    def threshold_for_quality(self, target: float) -> float:
        """The highest threshold whose calibrated quality reaches ``target`` (fraction of strong
        quality): the fewest strong calls expected to keep that quality."""
        if not self.calibration:
            raise ClassifierError(f"{self.source} has no calibration curve; set classifier.threshold")
        ok = [p for p in self.calibration if p.quality >= target]
        if not ok:  # even always-strong falls short: send everything to the strong tier
            return min(p.threshold for p in self.calibration)
        return max(p.threshold for p in ok)

    def expected(self, threshold: float) -> CalibrationPoint | None:
        """The calibration point at ``threshold`` (the nearest one at or above it)."""
        above = [p for p in self.calibration if p.threshold >= threshold]
        return min(above, key=lambda p: p.threshold) if above else None


def read_weights(path: Path, what: str) -> dict[str, Any]:
    """A weights file's JSON object (``what`` names it in the error: "router weights")."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ClassifierError(f"cannot read {what} {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ClassifierError(f"{path}: not a JSON object")
    return doc


def check_trained_on(what: str, source: str, trained: str, dim: int, name: str, got: int) -> None:
    """Refuse vectors from an embedder the weights were not trained on. Backends of one model
    (torch reference, ONNX int8 export) share its vector space and are accepted."""
    if vector_space(name) != vector_space(trained) or got != dim:
        raise ClassifierError(f"{what} {source} were trained on {trained} ({dim}-d), not {name} ({got}-d)")


def vector_space(embedder_name: str) -> str:
    """The model whose vector space an embedder produces: every all-MiniLM-L6-v2 backend
    ("sentence-transformers/all-MiniLM-L6-v2", "minilm-l6-onnx-int8", ...) is one space."""
    lowered = embedder_name.lower()
    return "all-minilm-l6-v2" if "minilm-l6" in lowered else lowered


def _sigmoid(z: F64) -> F64:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)), dtype=np.float64)
