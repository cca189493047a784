"""A graded suspicion score for a cheap model's worked math answer (pure; the verifier
cascade's ``escalate_share`` / ``escalate_above`` options and ``switchyard eval cascade`` use
the same code): several signals of the answer, each in [0, 1] or a small range, combined by a
logistic model into the probability-like score that the answer is wrong.

Signals (``signals(text, question)``), all read from the answer and the question only:

  no_final        no final answer (``#### x``, ``answer is x``, ``\\boxed{x}``): often a cut-off answer
  bad_calc        share of the calculations (``<<a*b=c>>`` or ``a * b = c``) whose value is wrong
  final_not_last  the final answer is not the last result computed
  final_unseen    the final answer's value appears nowhere in the working before it
  not_whole       the final answer is not whole though every number of the question is
  frac_steps      share of the intermediate results that are not whole (rounding, 11.11...)
  unused          share of the question's distinct numbers that the answer never mentions
  dangling        share of the intermediate results that no later calculation uses (a lost thread)
  no_steps        nothing was computed (no calculation at all)
  few_steps       fewer calculations than the question has numbers, less one (a shortcut)
  long_question   log2 of the question's length over 128 characters, clipped to [0, 3] (harder)
  long_answer     log2 of the answer's length over the question's, clipped to [0, 3]
  hedging         hedging and second thoughts ("assume", "round", "approximately", "however",
                  "actually", "wait", "not sure", ...), count clipped to 3, over 3
  final_words     the final answer line carries words after the number ("#### 90 minutes or ...")
  repeated        share of the answer's non-empty lines that repeat an earlier line
  refusal         the answer is a refusal

The default coefficients (``DEFAULT``) were fitted (L2 logistic regression, standardised
inputs folded back) on a labelled set of GSM8K answers by Mixtral-8x7B; they weigh generic
signals of a worked answer, not anything of that set, and ``switchyard eval cascade`` reports
them under cross-validation (fitted on one half, scored on the other, both ways)."""

from __future__ import annotations

import bisect
import collections
import itertools
import math as _math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.routing.verify import (
    _ANNOTATION,
    _NUMBER,
    _close,
    _eval,
    _number,
    answer_text,
    check,
    final_answer,
    question_of,
    refusal,
)

SIGNALS: Final = (
    "no_final",
    "bad_calc",
    "final_not_last",
    "final_unseen",
    "not_whole",
    "frac_steps",
    "unused",
    "dangling",
    "no_steps",
    "few_steps",
    "long_question",
    "long_answer",
    "hedging",
    "final_words",
    "repeated",
    "refusal",
)

_FINAL_AT: Final = re.compile(r"####|answer is|\\boxed\{", re.IGNORECASE)
_RESULT: Final = re.compile(r"=\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)")
_EXPR_CHARS: Final = frozenset("0123456789.,+-*/x()$% \\")
_HEDGE: Final = re.compile(
    r"\b(?:assum|approximat|roughly|round|however|actually|wait\b|not sure|unclear|maybe|"
    r"perhaps|seem|let's re|mistake|recalculat|correct|i think|probably|estimat|"
    r"cannot be determined|not possible)"
)
_MAX_CALCS: Final = 64  # calculations read at most (a worked answer has a dozen or so)
_SCAN: Final = 16_000  # characters of an answer (its two ends) and of a question read at most
_FINAL_LINE: Final = re.compile(r"####\s*\$?\s*-?[\d,]*\.?\d+\s*([^\n]*)")


@dataclass(frozen=True)
class Coefficients:
    """A logistic model of the signals: score = sigmoid(intercept + sum(weight * signal))."""

    intercept: float
    weights: Mapping[str, float]


# ``switchyard eval cascade --fit`` (an L2 logistic regression on gsm8k-dev's 645 Mixtral
# answers; signals that never varied there, repeated and refusal, keep a prior weight of 1).
# The weights are the signals' own; the intercept only sets the score's level, which the
# ``escalate_share`` option does not use (it ranks answers)
DEFAULT: Final = Coefficients(
    intercept=-2.04,
    weights={
        "no_final": 1.36,
        "bad_calc": 2.5,
        "final_not_last": 0.26,
        "final_unseen": 0.83,
        "not_whole": 4.43,
        "frac_steps": 2.45,
        "unused": 2.88,
        "dangling": 1.76,
        "no_steps": 1.86,
        "few_steps": 0.6,
        "long_question": 0.59,
        "long_answer": 0.01,
        "hedging": 0.89,
        "final_words": 0.5,
        "repeated": 1.0,
        "refusal": 1.0,
    },
)


def _keys(text: str) -> set[float]:
    """The numbers of ``text``, rounded to cents (numbers equal to the cent match)."""
    return {round(float(x.replace(",", "")), 2) for x in _NUMBER.findall(text)}  # always a number


def _calculations(text: str) -> list[tuple[str, float | None, float | None]]:
    """(expression, computed, stated) for each calculation of the working: ``<<expr=value>>``
    annotations, else plain ``a op b = c`` equations (the expression read back from the ``=``
    over arithmetic characters, at most 80 of them, on its line); the first ``_MAX_CALCS``."""
    found = [
        (m[1], _eval(m[1]), _number(m[2]) if _number(m[2]) is not None else _eval(m[2]))
        for m in itertools.islice(_ANNOTATION.finditer(text), _MAX_CALCS)
    ]
    if found:
        return found
    out: list[tuple[str, float | None, float | None]] = []
    for m in itertools.islice(_RESULT.finditer(text), _MAX_CALCS):
        start, i = max(0, m.start() - 80, text.rfind("\n", 0, m.start()) + 1), m.start()
        while i > start and text[i - 1] in _EXPR_CHARS:
            i -= 1
        expr = text[i : m.start()].replace("$", "").replace("%", "/100").strip(" ,.")
        if any(op in expr.lstrip("-") for op in "+-*/x") and any(c.isdigit() for c in expr):
            out.append((expr, _eval(expr), _number(m.group(1))))
    return out


def _dangling(calcs: Sequence[tuple[str, float | None, float | None]]) -> float:
    """Share of the intermediate results (all but the last) that no later calculation uses."""
    if len(calcs) < 2:
        return 0.0
    unused, later = 0, _keys(calcs[-1][0])
    for expr, _, said in reversed(calcs[:-1]):
        unused += said is not None and round(said, 2) not in later
        later |= _keys(expr)
    return unused / (len(calcs) - 1)


def signals(text: str, question: str = "") -> dict[str, float]:
    """The signals of a worked answer ``text`` to ``question`` (see the module's docstring).
    Linear in the text; an answer over ``_SCAN`` characters is read by its two ends (its length
    still counts whole), so that a runaway answer costs the event loop a bounded time."""
    size = len(text)
    if size > _SCAN:
        text = text[: _SCAN // 2] + "\n" + text[-_SCAN // 2 :]
    question = question[-_SCAN:]
    final = final_answer(text)
    cut = _FINAL_AT.search(text)
    working = text[: cut.start()] if cut else text
    calcs = _calculations(working)
    stated = [s for _, _, s in calcs if s is not None]
    wrong = sum(1 for _, got, said in calcs if got is not None and said is not None and not _close(got, said))
    q_numbers, a_numbers = _keys(question), _keys(working)
    w_numbers = a_numbers | {round(v, 2) for v in stated}
    whole_q = bool(q_numbers) and all(v == int(v) for v in q_numbers)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    tail = _FINAL_LINE.search(text)
    last = stated[-1] if stated else None
    return {
        "no_final": float(final is None),
        "bad_calc": wrong / len(calcs) if calcs else 0.0,
        "final_not_last": float(final is not None and last is not None and not _close(final, last)),
        "final_unseen": float(final is not None and bool(w_numbers) and round(final, 2) not in w_numbers),
        "not_whole": float(final is not None and whole_q and final != int(final)),
        "frac_steps": sum(1 for s in stated if s != int(s)) / len(stated) if stated else 0.0,
        "unused": len(q_numbers - a_numbers) / len(q_numbers) if q_numbers else 0.0,
        "dangling": _dangling(calcs),
        "no_steps": float(not calcs),
        "few_steps": float(bool(calcs) and len(calcs) < len(q_numbers) - 1),
        "long_question": min(3.0, max(0.0, _math.log2(max(1, len(question)) / 128))),
        "long_answer": min(3.0, max(0.0, _math.log2(max(1, size) / max(1, len(question))))),
        "hedging": min(3, len(_HEDGE.findall(text.lower()))) / 3,
        "final_words": float(tail is not None and bool(re.search(r"[A-Za-z]{2}", tail.group(1)))),
        "repeated": (len(lines) - len(set(lines))) / len(lines) if lines else 0.0,
        "refusal": float(refusal(text) is not None),
    }


def score(sig: Mapping[str, float], coef: Coefficients = DEFAULT) -> float:
    """The suspicion score in (0, 1): higher is likelier wrong."""
    z = coef.intercept + sum(w * sig.get(name, 0.0) for name, w in coef.weights.items())
    return 1 / (1 + _math.exp(-max(-30.0, min(30.0, z))))


def suspicion(text: str, question: str = "", coef: Coefficients = DEFAULT) -> float:
    return score(signals(text, question), coef)


class ShareCalibrator:
    """Escalate a configured share of answers without labels: an answer escalates when its
    score ranks in the top ``share`` of the last ``window`` scores (itself included), so the
    threshold follows the traffic (a quantile of recent scores). An answer tied with others at
    the cut escalates for the share of the tie the budget leaves (a deterministic low-discrepancy
    draw), so that a run of equal scores escalates about ``share`` of them."""

    def __init__(self, share: float, window: int = 500) -> None:
        if not 0 < share < 1:
            raise ValueError("escalate_share must be in (0, 1)")
        self.share, self.window = share, window
        self._recent: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []
        self._phase = 0.0

    def escalate(self, value: float) -> bool:
        self._recent.append(value)
        bisect.insort(self._sorted, value)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        below = bisect.bisect_left(self._sorted, value)
        ties = bisect.bisect_right(self._sorted, value) - below
        room = self.share * len(self._sorted) - (len(self._sorted) - below - ties)  # above it
        if room <= 0 or room >= ties:
            return room > 0
        self._phase = (self._phase + 0.6180339887498949) % 1.0
        return self._phase < room / ties


@dataclass
class Grading:
    """How a cascade grades the ``math`` check: escalate above a fixed score (``above``) or the
    top ``calibrator.share`` of recent scores (``calibrator``); exactly one is set."""

    above: float | None = None
    calibrator: ShareCalibrator | None = None
    coef: Coefficients = DEFAULT

    def escalates(self, value: float) -> bool:
        if self.calibrator is not None:
            return self.calibrator.escalate(value)
        return self.above is not None and value > self.above


def verdict(
    names: Sequence[str], completion: Mapping[str, Any], request: Mapping[str, Any], grading: Grading | None
) -> str | None:
    """The cascade's decision on a chat completion: the named pass/fail checks
    (verify.check), with ``math`` graded by the suspicion score when ``grading`` is set (the
    other checks stay pass/fail and escalate whatever the score). The reason, or None."""
    if grading is None or "math" not in names:
        return check(names, completion, request)
    why = check([n for n in names if n != "math"], completion, request)
    if why is not None:
        return why
    value = suspicion(answer_text(completion), question_of(request), grading.coef)
    if grading.escalates(value):
        return f"math: suspicion {value:.2f}"
    return None


def disagreement(first: str, second: str) -> str | None:
    """Self-consistency: None when a second sample of the cheap model reaches the first's final
    answer (or the first has none to compare: the math check judges that), else why not."""
    a = final_answer(first)
    if a is None:
        return None
    b = final_answer(second)
    if b is None:
        return "self-consistency: the second sample has no final answer"
    if not _close(a, b):
        return f"self-consistency: a second sample answers {b:g}, not {a:g}"
    return None
