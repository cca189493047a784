"""The difficulty model at inference (item response theory): a prompt's difficulty d is a
linear function of the shared sentence embedding and the cheap text features; a model with
ability a answers it well with probability sigmoid(a - d). Pure numpy, one 401-wide dot
product per prompt (the embedding comes from the caller, the shared embedder).

The weights file (``difficulty_weights.json``, written by ``switchyard train router --irt``)
holds the difficulty weights, the abilities fitted for every model of the training data and
the fitted map from a model's public MMLU-Pro accuracy to an ability, so a policy can give
its models either. ``choose`` picks the cheapest candidate whose predicted quality is within
the route's quality target of the best candidate's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.routing.classifier import ClassifierError, check_trained_on, read_weights
from gateway.routing.features import FEATURE_NAMES, feature_matrix, text_features

FORMAT: Final = "switchyard-difficulty/1"
SHIPPED_DIFFICULTY: Final = Path(__file__).resolve().parent / "difficulty_weights.json"
LOG_CHARS: Final = FEATURE_NAMES.index("log_chars")

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


def _sigmoid(z: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * z))


class DifficultyModel:
    """difficulty(embedding, text) on the logit scale; success(d, ability) in [0, 1]."""

    def __init__(self, doc: dict[str, Any], source: str) -> None:
        try:
            if doc.get("format") != FORMAT:
                raise ClassifierError(f"{source}: not a {FORMAT} weights file")
            self.embedder_name = str(doc["embedder"]["name"])
            self.dim = int(doc["embedder"]["dim"])
            if tuple(doc["features"]) != FEATURE_NAMES:
                raise ClassifierError(f"{source}: trained on other text features than this version computes")
            mean = np.asarray(doc["feature_mean"], dtype=np.float64)
            std = np.asarray(doc["feature_std"], dtype=np.float64)
            w_feat = np.asarray(doc["w_feat"], dtype=np.float64) / std  # standardisation folded in
            self._w_emb = np.asarray(doc["w_emb"], dtype=np.float64) * float(doc["emb_scale"])
            self._w_feat = w_feat
            self._bias = -float(w_feat @ mean)
            self._d_mean, self._d_std = float(doc["d_mean"]), float(doc["d_std"])
            self._len_prior = float(doc["length_prior"])
            self._len_mean, self._len_std = float(mean[LOG_CHARS]), float(std[LOG_CHARS])
            self.abilities: dict[str, float] = {str(k): float(v) for k, v in doc["abilities"].items()}
            amap = doc["ability_from_mmlu_pro"]
            self._map = (float(amap["intercept"]), float(amap["slope"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ClassifierError):
                raise
            raise ClassifierError(f"{source}: malformed difficulty weights ({exc!r})") from None
        if self._w_emb.shape != (self.dim,) or self._w_feat.shape != (len(FEATURE_NAMES),):
            raise ClassifierError(f"{source}: weight shapes do not match the declared dimensions")
        if not self._d_std > 0:
            raise ClassifierError(f"{source}: 'd_std' must be positive")
        self.source = source

    @classmethod
    def load(cls, path: Path | None = None) -> DifficultyModel:
        path = path or SHIPPED_DIFFICULTY
        return cls(read_weights(path, "difficulty weights"), str(path))

    def check_embedder(self, name: str, dim: int) -> None:
        check_trained_on("difficulty weights", self.source, self.embedder_name, self.dim, name, dim)

    def difficulty(self, embedding: F32, text: str) -> float:
        if embedding.shape != (self.dim,):
            raise ClassifierError(f"embedding has shape {embedding.shape}, expected ({self.dim},)")
        feats = np.asarray(text_features(text), dtype=np.float64)
        return float(embedding.astype(np.float64) @ self._w_emb + feats @ self._w_feat + self._bias)

    def difficulty_batch(self, embeddings: F32, texts: list[str]) -> F64:
        if embeddings.shape != (len(texts), self.dim):
            raise ClassifierError(
                f"embeddings have shape {embeddings.shape}, expected ({len(texts)}, {self.dim})"
            )
        d = embeddings.astype(np.float64) @ self._w_emb + feature_matrix(texts) @ self._w_feat + self._bias
        return np.asarray(d, dtype=np.float64)

    def scores(self, embeddings: F32, texts: list[str]) -> F64:
        """The evaluator's score in (0, 1), higher = needs a stronger model: the standardised
        difficulty plus the prompt-length prior, through a sigmoid."""
        d = (self.difficulty_batch(embeddings, texts) - self._d_mean) / self._d_std
        z_len = (feature_matrix(texts)[:, LOG_CHARS] - self._len_mean) / self._len_std
        return np.asarray(0.5 * (1.0 + np.tanh(0.5 * (d + self._len_prior * z_len))), dtype=np.float64)

    def ability(
        self, model: str, *, ability: float | None = None, mmlu_pro: float | None = None
    ) -> float | None:
        """A model's ability: given, else mapped from its MMLU-Pro accuracy, else fitted on the
        training data (by its name there, any source), else None."""
        if ability is not None:
            return ability
        if mmlu_pro is not None:
            p = min(max(mmlu_pro, 0.01), 0.99)
            return self._map[0] + self._map[1] * math.log(p / (1.0 - p))
        hits = [v for k, v in self.abilities.items() if k.split("/", 1)[-1] == model]
        return hits[0] if hits else None

    @staticmethod
    def success(difficulty: float, ability: float) -> float:
        return _sigmoid(ability - difficulty)


@dataclass(frozen=True, slots=True)
class Prediction:
    model: str
    quality: float  # predicted probability of a good answer
    cost: float  # expected USD of the request on this model


def choose(preds: list[Prediction], quality_target: float) -> Prediction:
    """The cheapest candidate whose predicted quality is at least ``quality_target`` times the
    best candidate's (ties: the better predicted quality, then the order given)."""
    best = max(p.quality for p in preds)
    ok = [p for p in preds if p.quality >= quality_target * best - 1e-12]
    return min(ok, key=lambda p: (p.cost, -p.quality))
