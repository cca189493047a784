"""The text side of the semantic-cache verifier: tokens, hard rules and lexical features.

Tokens are Unicode word runs (``\\w+``, with a glued ``++``/``#`` so that "C++" and "C#"
stay distinct from "C") plus runs of symbols ("()", "[]", "~", "%"); plain sentence
punctuation and quotes are dropped. Non-Latin words are words, so two questions that
differ only in their Korean or Japanese part never count as the same words."""

from __future__ import annotations

import math
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

_TOKEN = re.compile(r"\w+(?:'\w+)?(?:\+\+|#)?|[^\w\s]+")
_PUNCT = frozenset("?.!,;:'\"`-\u201c\u201d\u2018\u2019\u2026")
_PUNCT_CHARS = "".join(sorted(_PUNCT))  # str.strip's argument
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
_NOT_CONTENT = _STOP | _NEGATIONS
_COMPARATIVE_WORDS = (
    "better best worse worst more less most least faster fastest cheaper cheapest easier easiest "
    "harder hardest bigger biggest larger largest smaller smallest higher highest lower lowest"
)
_COMPARATIVES = frozenset(_COMPARATIVE_WORDS.split())
_ANTONYM_PAIRS = (
    "positive negative,best worst,advantages disadvantages,pros cons,more less,good bad,"
    "better worse,increase decrease,before after,male female,men women,man woman,boy girl,"
    "boys girls,rich poor,buy sell,first last,old new,older younger,start stop,win lose,"
    "love hate,pass fail,cheap expensive,high low,legal illegal,possible impossible,"
    "import export,north south,east west,left right,open close"
)
_ANTONYMS = frozenset(
    (x, y) for pair in _ANTONYM_PAIRS.split(",") for x, y in [pair.split(), pair.split()[::-1]]
)

FEATURES = (
    "cosine", "cosine_sq", "char_len_ratio", "word_len_diff", "token_jaccard", "content_jaccard",
    "content_only_a", "content_only_b", "bigram_jaccard", "caps_diff", "qword_mismatch",
    "first_word_same", "last_content_same", "n_only_a", "n_only_b", "n_differing",
    "no_differing", "n_caps_differing", "n_comparatives_differing", "char3_jaccard",
    "n_words_differing", "one_side_contained", "n_non_ascii_differing",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Text:
    """The parts of a text the features need, computed once per text."""

    raw: str
    words: tuple[str, ...]  # lowercase tokens, sentence punctuation dropped
    numbers: tuple[str, ...]  # sorted, normalised
    operators: tuple[str, ...]  # sorted
    negated: bool
    caps: frozenset[str]  # capitalised tokens after the first word, lowercased
    qword: str
    content: frozenset[str]
    code: tuple[str, ...]  # sorted tokens such as "c++", "c#"


def analyse(text: str) -> Text:
    """The parts of ``text`` (every lookup analyses its query: kept lean, set operations over
    per-word generators where they give the same result)."""
    tokens = [t for t in _TOKEN.findall(text) if t.strip(_PUNCT_CHARS)]  # not all punctuation
    words = tuple(map(str.lower, tokens))
    numbers = [n.replace(",", "") for n in _NUMBER.findall(text)]
    numbers += [_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS]
    operators = [o.replace("×", "*").replace("÷", "/") for o in _OPERATOR.findall(text)]
    operators += [_OPERATOR_WORDS[w] for w in words if w in _OPERATOR_WORDS]
    negated = not _NEGATIONS.isdisjoint(words) or any(w.endswith("n't") for w in words)
    caps = frozenset(t.lower() for t in tokens[1:] if t[:1].isupper() and t.lower() not in _STOP)
    qword = next((w for w in words if w in _QWORDS), "")
    content = frozenset(words) - _NOT_CONTENT
    code = tuple(sorted(w for w in words if len(w) > 1 and w[0].isalnum() and w[-1] in "+#"))
    return Text(
        text, words, tuple(sorted(numbers)), tuple(sorted(operators)), negated, caps, qword, content, code
    )


def rule_key(t: Text) -> int:
    """A hash of the fields ``hard_reject`` checks first (numbers, operators, negation, code):
    two texts whose keys differ are always hard-rejected (equal keys prove nothing), so a
    cache can refuse a candidate from a stored int without analysing its text again."""
    return hash((t.numbers, t.operators, t.negated, t.code))


def hard_reject(a: Text, b: Text) -> str | None:
    """A reason the two texts can never share an answer, whatever their similarity."""
    if a.numbers != b.numbers:
        return "numbers"
    if a.operators != b.operators:
        return "operators"
    if a.negated != b.negated:
        return "negation"
    if a.code != b.code:
        return "code"  # C vs C++ vs C#
    only_a, only_b = set(a.words) - set(b.words), set(b.words) - set(a.words)
    if any((x, y) in _ANTONYMS for x in only_a for y in only_b):
        return "antonym"  # "positive effects" vs "negative effects"
    return None


def _jaccard(x: AbstractSet[object], y: AbstractSet[object]) -> float:
    union = len(x | y)
    return len(x & y) / union if union else 1.0


def _char3(s: str) -> set[str]:
    s = s.lower()
    return {s[i : i + 3] for i in range(len(s) - 2)}


def features(a: Text, b: Text, cosine: float) -> list[float]:
    """The lexical feature vector (one value per FEATURES entry)."""
    la, lb = len(a.raw), len(b.raw)
    bi_a = set(zip(a.words, a.words[1:], strict=False))
    bi_b = set(zip(b.words, b.words[1:], strict=False))
    last_a = next((w for w in reversed(a.words) if w in a.content), "")
    last_b = next((w for w in reversed(b.words) if w in b.content), "")
    only_a, only_b = a.content - b.content, b.content - a.content
    differing = only_a | only_b
    return [
        cosine,
        cosine * cosine,
        min(la, lb) / max(la, lb, 1),
        math.log1p(abs(len(a.words) - len(b.words))),
        _jaccard(frozenset(a.words), frozenset(b.words)),
        _jaccard(a.content, b.content),
        math.log1p(len(only_a)),
        math.log1p(len(only_b)),
        _jaccard(bi_a, bi_b),
        math.log1p(len(a.caps ^ b.caps)),
        float(a.qword != b.qword),
        float(a.words[:1] == b.words[:1]),
        float(last_a == last_b),
        float(len(only_a)),
        float(len(only_b)),
        float(len(differing)),
        float(not differing),
        float(len(a.caps ^ b.caps)),
        float(len(differing & _COMPARATIVES)),
        _jaccard(_char3(a.raw), _char3(b.raw)),
        float(len(set(a.words) ^ set(b.words))),
        float(not only_a or not only_b),
        float(sum(1 for w in differing if not w.isascii())),
    ]
