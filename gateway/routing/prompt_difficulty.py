"""The pair-agnostic prompt-difficulty score (`switchyard router score --scorer difficulty`):
the design that generalised best across sources in `switchyard eval router --multi`
(``ridge-x+lenfit``, gateway.lab.difficulty_designs): a ridge regression of the prompt's pooled
residual success over every model of the training data, on the shared embedding, the 17 text
features and the answer-format/rarity traits, plus prompt length at the weight learnt without
the scored source. Pure numpy: one dot product per prompt.

score = sigmoid(z_d + length_weight * z_len), z_d the standardised difficulty (minus the
predicted residual success), z_len the standardised log prompt length; higher = needs a
stronger model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.routing.classifier import ClassifierError, check_trained_on, read_weights
from gateway.routing.features import FEATURE_NAMES, feature_matrix
from gateway.routing.prompt_traits import TRAIT_NAMES, trait_matrix

FORMAT: Final = "switchyard-prompt-difficulty/1"
SHIPPED_PROMPT_DIFFICULTY: Final = Path(__file__).resolve().parent / "prompt_difficulty.json"
LOG_CHARS: Final = FEATURE_NAMES.index("log_chars")

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


class PromptDifficulty:
    def __init__(self, doc: dict[str, Any], source: str) -> None:
        try:
            if doc.get("format") != FORMAT:
                raise ClassifierError(f"{source}: not a {FORMAT} weights file")
            self.embedder_name = str(doc["embedder"]["name"])
            self.dim = int(doc["embedder"]["dim"])
            if tuple(doc["features"]) != (*FEATURE_NAMES, *TRAIT_NAMES):
                raise ClassifierError(f"{source}: trained on other text features than this version computes")
            mean = np.asarray(doc["feature_mean"], dtype=np.float64)
            std = np.asarray(doc["feature_std"], dtype=np.float64)
            w_feat = np.asarray(doc["w_feat"], dtype=np.float64)
            self._w_emb = np.asarray(doc["w_emb"], dtype=np.float64) * float(doc["emb_scale"])
            self._sign = float(doc["sign"])
            self._d_mean, self._d_std = float(doc["d_mean"]), float(doc["d_std"])
            self._len_weight = float(doc["length_weight"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ClassifierError):
                raise
            raise ClassifierError(f"{source}: malformed prompt-difficulty weights ({exc!r})") from None
        n_feat = len(FEATURE_NAMES) + len(TRAIT_NAMES)
        if self._w_emb.shape != (self.dim,) or w_feat.shape != (n_feat,) or mean.shape != (n_feat,):
            raise ClassifierError(f"{source}: weight shapes do not match the declared dimensions")
        if not (self._d_std > 0 and np.all(std > 0)):
            raise ClassifierError(f"{source}: 'd_std' and 'feature_std' must be positive")
        self._w_feat = w_feat / std  # standardisation folded in
        self._bias = -float(self._w_feat @ mean)
        self._len_mean, self._len_std = float(mean[LOG_CHARS]), float(std[LOG_CHARS])
        self.source = source

    @classmethod
    def load(cls, path: Path | None = None) -> PromptDifficulty:
        path = path or SHIPPED_PROMPT_DIFFICULTY
        return cls(read_weights(path, "prompt-difficulty weights"), str(path))

    def check_embedder(self, name: str, dim: int) -> None:
        check_trained_on("prompt-difficulty weights", self.source, self.embedder_name, self.dim, name, dim)

    def scores(self, embeddings: F32, texts: list[str]) -> F64:
        """(n,) scores in (0, 1), higher = needs a stronger model."""
        if embeddings.shape != (len(texts), self.dim):
            raise ClassifierError(
                f"embeddings have shape {embeddings.shape}, expected ({len(texts)}, {self.dim})"
            )
        feats = np.hstack([feature_matrix(texts), trait_matrix(texts)])
        d = self._sign * (embeddings.astype(np.float64) @ self._w_emb + feats @ self._w_feat + self._bias)
        z = (d - self._d_mean) / self._d_std
        z_len = (feats[:, LOG_CHARS] - self._len_mean) / self._len_std
        return np.asarray(0.5 * (1.0 + np.tanh(0.5 * (z + self._len_weight * z_len))), dtype=np.float64)
