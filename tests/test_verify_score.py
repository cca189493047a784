"""The graded math check (routing/verify_score.py): each signal on an answer that shows it and
one that does not, the score, the online share calibrator, the cascade's verdict, the logistic
fit of the evaluation (lab/cascade_eval.py) and the cascade options of the policy."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from gateway.config.loader import PolicyError, load_policy
from gateway.lab.cascade_eval import PRIOR_WEIGHT, fit
from gateway.routing import verify_score as vs
from tests.gateway_harness import mock_policy

Q = "Tom has 3 boxes of 12 apples. He eats 4 apples. How many apples are left?"
GOOD = "Tom has 3 * 12 = <<3*12=36>>36 apples.\nHe eats 4, so 36 - 4 = <<36-4=32>>32 are left.\n#### 32"


def _sig(text: str, question: str = Q) -> dict[str, float]:
    return vs.signals(text, question)


def test_a_clean_answer_shows_no_signal_but_its_length() -> None:
    sig = _sig(GOOD)
    assert set(sig) == set(vs.SIGNALS)
    assert {k for k, v in sig.items() if v} == {"long_answer"}


def test_no_final() -> None:
    assert _sig("Tom has 3 * 12 = <<3*12=36>>36 apples. He eats 4, so 36 - 4 = <<36-4")["no_final"] == 1
    assert _sig("3 * 12 - 4 = 32, so the answer is 32.")["no_final"] == 0


def test_bad_calc_share() -> None:
    bad = GOOD.replace("<<3*12=36>>36", "<<3*12=38>>38").replace(
        "36 - 4 = <<36-4=32>>32", "38 - 4 = <<38-4=34>>34"
    )
    assert _sig(bad.replace("#### 32", "#### 34"))["bad_calc"] == 0.5
    assert _sig("3 x 12 = 38 apples, 38 - 4 = 34\n#### 34")["bad_calc"] == 0.5  # plain equations too


def test_final_not_last() -> None:
    assert _sig(GOOD.replace("#### 32", "#### 36"))["final_not_last"] == 1
    assert _sig(GOOD)["final_not_last"] == 0


def test_final_unseen() -> None:
    assert _sig("He has some apples left over after eating.\n#### 32")["final_unseen"] == 0  # no working
    assert _sig("There were 36 apples and 4 eaten.\n#### 30")["final_unseen"] == 1
    assert _sig("There were 36 apples and 32 stay.\n#### 32")["final_unseen"] == 0


def test_not_whole() -> None:
    half = "36 / 8 = <<36/8=4.5>>4.5\n#### 4.5"
    assert _sig(half)["not_whole"] == 1
    assert _sig(half, "Split 36.5 apples in 8")["not_whole"] == 0


def test_frac_steps() -> None:
    assert _sig("12 / 5 = <<12/5=2.4>>2.4 and 2.4 * 5 = <<2.4*5=12>>12\n#### 12")["frac_steps"] == 0.5
    assert _sig(GOOD)["frac_steps"] == 0


def test_unused_numbers_of_the_question() -> None:
    assert _sig("Tom has 3 * 12 = <<3*12=36>>36 apples.\n#### 36")["unused"] == pytest.approx(1 / 3)
    assert _sig(GOOD)["unused"] == 0


def test_dangling_results() -> None:
    lost = "3 * 12 = <<3*12=36>>36 apples. 4 * 2 = <<4*2=8>>8. 12 - 4 = <<12-4=8>>8\n#### 8"
    assert _sig(lost)["dangling"] == 1.0  # neither 36 nor the first 8 feeds a later calculation
    chained = "3 * 12 = <<3*12=36>>36, 36 - 4 = <<36-4=32>>32, 32 / 2 = <<32/2=16>>16\n#### 16"
    assert _sig(chained)["dangling"] == 0


def test_no_steps_and_few_steps() -> None:
    assert _sig("Tom keeps 32 apples.\n#### 32")["no_steps"] == 1
    assert _sig(GOOD)["no_steps"] == 0
    long_q = "He buys 3 boxes of 12 apples at 2 dollars, 5 pears at 4 dollars and 7 plums. Cost?"
    assert _sig("3 * 12 = <<3*12=36>>36\n#### 36", long_q)["few_steps"] == 1
    assert _sig(GOOD)["few_steps"] == 0


def test_long_question_and_long_answer() -> None:
    assert _sig(GOOD, "x" * 128)["long_question"] == 0
    assert _sig(GOOD, "x" * 512)["long_question"] == pytest.approx(2.0)
    assert _sig(GOOD, "x" * 10_000)["long_question"] == 3.0  # clipped
    assert _sig(GOOD, GOOD)["long_answer"] == 0
    assert _sig(GOOD, GOOD[:21])["long_answer"] == pytest.approx(np.log2(len(GOOD) / 21))


def test_hedging() -> None:
    assert _sig(GOOD)["hedging"] == 0
    assert _sig("Assuming he eats them, approximately 32 are left.\n#### 32")["hedging"] == pytest.approx(
        2 / 3
    )
    assert _sig("Wait, actually, however, maybe 32.\n#### 32")["hedging"] == 1.0  # clipped at 3


def test_final_words() -> None:
    assert _sig(GOOD + " apples or about three dozen")["final_words"] == 1
    assert _sig(GOOD + "\n\n")["final_words"] == 0


def test_repeated_lines() -> None:
    assert _sig("36 apples.\n36 apples.\n36 apples.\n#### 36")["repeated"] == 0.5
    assert _sig(GOOD)["repeated"] == 0


def test_refusal_signal() -> None:
    assert _sig("I'm sorry, but I can't help with that.")["refusal"] == 1
    assert _sig(GOOD)["refusal"] == 0


def test_a_runaway_answer_is_read_in_bounded_time() -> None:
    assert len(vs._calculations("<<1+1=2>> " * 500)) == 64  # the first calculations only
    runaway = "2 + 2 = <<2+2=4>>4\n" + "and so on, " * 100_000 + "\n#### 4"
    sig = vs.signals(runaway, Q)
    assert sig["no_final"] == 0 and sig["final_not_last"] == 0  # both ends are read
    assert sig["long_answer"] == 3.0  # its whole length counts


def test_score_orders_suspicious_answers_above_clean_ones() -> None:
    clean = vs.suspicion(GOOD, Q)
    assert 0 < clean < 0.5
    assert vs.suspicion(GOOD.replace("#### 32", ""), Q) > clean
    assert vs.suspicion(GOOD.replace("<<36-4=32>>", "<<36-4=30>>"), Q) > clean
    coef = vs.Coefficients(0.0, {"no_final": 30.0})
    assert vs.score({"no_final": 1.0}, coef) > 0.99 and vs.score({}, coef) == 0.5


def test_share_calibrator_escalates_the_configured_share_of_the_top() -> None:
    rng = random.Random(7)
    cal = vs.ShareCalibrator(0.3, window=200)
    values = [rng.random() for _ in range(4000)]
    flags = [cal.escalate(v) for v in values]
    assert 0.27 < sum(flags[200:]) / len(flags[200:]) < 0.33
    escalated = [v for v, f in zip(values[200:], flags[200:], strict=True) if f]
    kept = [v for v, f in zip(values[200:], flags[200:], strict=True) if not f]
    assert min(escalated) > 0.5 and max(kept) < 0.8  # the top of the scores, not a random share
    ties = vs.ShareCalibrator(0.4)
    assert 0.38 < sum(ties.escalate(0.5) for _ in range(1000)) / 1000 < 0.42  # all equal
    assert len(cal._sorted) == 200  # the window holds
    with pytest.raises(ValueError, match="escalate_share"):
        vs.ShareCalibrator(1.0)


def test_verdict_grades_math_and_keeps_the_other_checks_pass_fail() -> None:
    def completion(text: str) -> dict[str, object]:
        return {"choices": [{"message": {"content": text}}]}

    request = {"messages": [{"role": "user", "content": Q}]}
    inconsistent = completion(GOOD.replace("#### 32", "#### 36"))  # the pass/fail check fails it
    assert vs.verdict(["math"], inconsistent, request, None) is not None
    lenient = vs.Grading(above=0.99)
    assert vs.verdict(["math"], inconsistent, request, lenient) is None
    assert "suspicion" in (vs.verdict(["math"], inconsistent, request, vs.Grading(above=0.01)) or "")
    refused = completion("I'm sorry, but I can't help with that.")
    assert "refusal" in (vs.verdict(["math", "refusal"], refused, request, lenient) or "")


def test_disagreement_of_two_samples() -> None:
    assert vs.disagreement(GOOD, GOOD.replace("<<3*12=36>>", "<<12*3=36>>")) is None  # same answer
    assert "32" in (vs.disagreement(GOOD, "36 - 6 = 30\n#### 30") or "")
    assert "no final answer" in (vs.disagreement(GOOD, "36 - 4 is what is left") or "")
    assert vs.disagreement("no final answer here", GOOD) is None  # the math check's business


def test_fit_recovers_the_signals_that_predict_failure() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros((2000, len(vs.SIGNALS)))
    x[:, 0] = rng.random(2000) < 0.3  # no_final: predictive
    x[:, 1] = rng.random(2000)  # bad_calc: noise
    y = (rng.random(2000) < np.where(x[:, 0] > 0, 0.9, 0.2)).astype(float)
    coef = fit(x, y)
    assert coef.weights["no_final"] > 2 and abs(coef.weights["bad_calc"]) < 0.5
    assert coef.weights["refusal"] == PRIOR_WEIGHT  # never varied: the prior weight


def test_cascade_grading_options_are_checked(tmp_path: Path) -> None:
    for cascade, why in (
        ("{verify: [refusal], escalate_share: 0.4}", "grade the 'math' check"),
        ("{verify: [math], escalate_share: 0.4, escalate_above: 0.5}", "not both"),
        ("{verify: [math], escalate_share: 1.5}", "escalate_share"),
        ("{verify: [json], second_sample: true}", "second_sample"),
    ):
        path = tmp_path / "p.yaml"
        route = f"  c:\n    targets: [small, large]\n    cascade: {cascade}\n"
        path.write_text(mock_policy("http://127.0.0.1:9").replace("routes:\n", "routes:\n" + route, 1))
        with pytest.raises(PolicyError, match=why):
            load_policy(path)
