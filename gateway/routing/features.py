"""Cheap text features of a prompt for the complexity classifier: pure Python, a few
microseconds each. They complement the sentence embedding with what it encodes poorly:
length, how much arithmetic and code a prompt holds, and what kind of question it asks."""

from __future__ import annotations

import math
import re
from typing import Final

import numpy as np
import numpy.typing as npt

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[A-Za-z]+")
_MATH_OP = re.compile(r"[=+*/^<>%]|(?<=\d)\s*-\s*(?=\d)|\\(?:frac|sqrt|sum|int|cdot|times)")
_CODE = re.compile(
    r"```|\bdef |\bclass |\breturn\b|\bimport |#include|\bfunction\b|;\s*$|[{}]|=>|\bSELECT\b",
    re.MULTILINE,
)
_CHOICES = re.compile(r"^\s*\(?[A-Da-d][.)]\s", re.MULTILINE)
_HOW_MANY = re.compile(r"\bhow (?:many|much|long|far|old)\b", re.IGNORECASE)
_WHY = re.compile(r"\b(?:why|explain|prove|derive|justify|compare|analy[sz]e)\b", re.IGNORECASE)
_WRITE = re.compile(r"\b(?:write|compose|draft|create|generate|implement|design)\b", re.IGNORECASE)
_STEP = re.compile(
    r"\b(?:then|after|before|each|every|per|total|remaining|twice|half|times|percent|more than|less than)\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"\b(?:not|never|except|false|incorrect|least)\b", re.IGNORECASE)
_SENTENCE = re.compile(r"[.!?](?:\s|$)")

FEATURE_NAMES: Final = (
    "log_chars",
    "log_words",
    "log_lines",
    "log_sentences",
    "mean_word_len",
    "log_numbers",
    "digit_frac",
    "log_math_ops",
    "log_code_markers",
    "upper_frac",
    "has_choices",
    "how_many",
    "why_explain",
    "write_create",
    "log_step_words",
    "log_negations",
    "question_marks",
)
N_FEATURES: Final = len(FEATURE_NAMES)


def _log1(n: int) -> float:
    return math.log1p(n)


def text_features(text: str) -> list[float]:
    """The feature vector of one prompt, in FEATURE_NAMES order (not yet standardised)."""
    n_chars = len(text)
    words = _WORD.findall(text)
    n_words = len(words)
    digits = sum(map(str.isdigit, text))  # map: half the cost of a generator, the same count
    upper = sum(map(str.isupper, text))
    return [
        _log1(n_chars),
        _log1(n_words),
        _log1(text.count("\n")),
        _log1(len(_SENTENCE.findall(text))),
        (sum(len(w) for w in words) / n_words) if n_words else 0.0,
        _log1(len(_NUMBER.findall(text))),
        digits / n_chars if n_chars else 0.0,
        _log1(len(_MATH_OP.findall(text))),
        _log1(len(_CODE.findall(text))),
        upper / n_chars if n_chars else 0.0,
        1.0 if len(_CHOICES.findall(text)) >= 2 else 0.0,
        1.0 if _HOW_MANY.search(text) else 0.0,
        1.0 if _WHY.search(text) else 0.0,
        1.0 if _WRITE.search(text) else 0.0,
        _log1(len(_STEP.findall(text))),
        _log1(len(_NEGATION.findall(text))),
        float(min(text.count("?"), 5)),
    ]


def feature_matrix(texts: list[str]) -> npt.NDArray[np.float64]:
    """(n, N_FEATURES) float64 features of many prompts."""
    out = np.zeros((len(texts), N_FEATURES), dtype=np.float64)
    for i, text in enumerate(texts):
        out[i] = text_features(text)
    return out
