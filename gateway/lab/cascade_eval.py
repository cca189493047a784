"""The verifier cascade on data with answers (``../shared/data/routing/gsm8k-dev.jsonl``: the
weak and strong models' real answers and whether each is right): the weak model answers every
prompt, its answer is checked (routing/verify.py, routing/verify_score.py: the code the live
route runs), and an escalation pays the strong model on top. Reported beside always-weak,
always-strong and the oracle cascade (escalate exactly the wrong answers), each design with
its power to predict the weak answer's failure:

  pass/fail checks      the named checks as they are (``math``: consistent or not)
  suspicion, shipped    the graded ``math`` check with the shipped coefficients (``DEFAULT``);
                        in-sample on gsm8k-dev, where they were fitted (``--fit`` prints them)
  suspicion, 2-fold CV  coefficients fitted on one half (sha256 of the prompt, even/odd) and
                        scored on the other, both ways: the honest figure of the fitted model
  suspicion, equal      every signal weighs 1 (nothing fitted)

The graded lines escalate the top ``share`` of answers by the online calibrator the live route
uses (in file order, no labels), or every answer above ``above``. ``cv_spread`` repeats the
2-fold cross-validation on 10 random halvings (the spread a different sample would give).

Prices (USD per 1M input/output tokens, list): the weak model Mixtral-8x7B-Instruct at 0.60/0.60
(Together), the strong GPT-4-1106-preview at 10/30 (OpenAI); tokens = characters / 4."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from gateway.routing.verify_score import (
    DEFAULT,
    SIGNALS,
    Coefficients,
    Grading,
    ShareCalibrator,
    score,
    signals,
    verdict,
)

WEAK_PRICE: Final = (0.60, 0.60)
STRONG_PRICE: Final = (10.0, 30.0)
PRIOR_WEIGHT: Final = 1.0  # a signal that never varies in the training data keeps this weight
F64 = npt.NDArray[np.float64]


def _cost(prompt: str, answer: str, price: tuple[float, float]) -> float:
    return (len(prompt) / 4 * price[0] + len(answer) / 4 * price[1]) / 1e6


def _half(prompt: str) -> int:
    return hashlib.sha256(prompt.encode()).digest()[0] % 2


def fit(x: F64, y: F64, l2: float = 1.0) -> Coefficients:
    """An L2 logistic regression of ``y`` (1 = the weak answer is wrong) on the signals ``x``
    (columns in SIGNALS order), fitted on standardised columns (Newton steps) and folded back
    to raw signals. A column without variance keeps PRIOR_WEIGHT (the data cannot weigh it)."""
    mean, sd = x.mean(axis=0), x.std(axis=0)
    flat = sd < 1e-9
    sd[flat] = 1.0
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / sd])
    w = np.zeros(z.shape[1])
    penalty = l2 * np.diag(np.r_[0.0, np.ones(z.shape[1] - 1)])
    for _ in range(30):
        p = 1 / (1 + np.exp(-(z @ w)))
        step = np.linalg.solve((z.T * (p * (1 - p))) @ z + penalty, z.T @ (p - y) + penalty @ w)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    b = w[1:] / sd
    b[flat] = PRIOR_WEIGHT
    intercept = float(w[0] - mean[~flat] @ b[~flat])
    return Coefficients(round(intercept, 2), {k: round(float(v), 2) for k, v in zip(SIGNALS, b, strict=True)})


def _auc(s: F64, y: F64) -> float:
    """The area under the ROC curve of scores ``s`` for labels ``y`` (ties count half)."""
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return 0.5
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


class _Data:
    def __init__(self, path: Path) -> None:
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        self.rows = rows
        self.weak_ok = np.array([r["weak_correct"] for r in rows], dtype=float)
        self.strong_ok = np.array([r["strong_correct"] for r in rows], dtype=float)
        self.weak_cost = np.array([_cost(r["prompt"], r["weak_response"], WEAK_PRICE) for r in rows])
        self.strong_cost = np.array([_cost(r["prompt"], r["strong_response"], STRONG_PRICE) for r in rows])
        self.wrong = 1 - self.weak_ok
        self.x = np.array([[sig[k] for k in SIGNALS] for sig in (_signals(r) for r in rows)])
        self.half = np.array([_half(r["prompt"]) for r in rows])

    def line(self, escalate: npt.NDArray[np.bool_]) -> tuple[float, float]:
        """(quality, cost) of the cascade that escalates ``escalate``."""
        quality = np.where(escalate, self.strong_ok, self.weak_ok).mean()
        return float(quality), float((self.weak_cost + self.strong_cost * escalate).sum())


def _signals(r: dict[str, Any]) -> dict[str, float]:
    return signals(r["weak_response"], r["prompt"])


def _request(r: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {"choices": [{"message": {"content": r["weak_response"]}}]},
        {"messages": [{"role": "user", "content": r["prompt"]}]},
    )


def _run(
    data: _Data,
    checks: Sequence[str],
    grading: Callable[[], Grading | None],
    coef_of: Callable[[int], Coefficients] | None = None,
    parts: F64 | None = None,
    times: list[float] | None = None,
) -> npt.NDArray[np.bool_]:
    """Whether each row escalates, in file order, by ``verdict`` (the live route's code). With
    ``parts``, each part is its own stream (its own calibrator) graded by ``coef_of(part)``;
    ``times`` gets each verdict's seconds (what the check costs the event loop per answer)."""
    groups = np.zeros(len(data.rows), dtype=int) if parts is None else parts.astype(int)
    out = np.zeros(len(data.rows), dtype=bool)
    for g in np.unique(groups):
        grade = grading()
        if grade is not None and coef_of is not None:
            grade.coef = coef_of(int(g))
        for i in np.nonzero(groups == g)[0]:
            request = _request(data.rows[i])
            t0 = time.perf_counter()
            out[i] = verdict(checks, *request, grade) is not None
            if times is not None:
                times.append(time.perf_counter() - t0)
    return out


def evaluate(
    path: Path,
    checks: Sequence[str] = ("math", "refusal"),
    share: float | None = 0.4,
    above: float | None = None,
) -> dict[str, Any]:
    data = _Data(path)
    n, ref_q, ref_c = len(data.rows), float(data.strong_ok.mean()), float(data.strong_cost.sum())

    def grading() -> Grading:
        return Grading(above=above, calibrator=ShareCalibrator(share) if share is not None else None)

    equal = Coefficients(0.0, dict.fromkeys(SIGNALS, 1.0))
    folds = {h: fit(data.x[data.half != h], data.wrong[data.half != h]) for h in (0, 1)}
    took: dict[str, list[float]] = {"pass/fail checks": [], "graded": []}
    designs: dict[str, tuple[npt.NDArray[np.bool_], F64 | None]] = {
        "cascade: pass/fail checks": (_run(data, checks, lambda: None, times=took["pass/fail checks"]), None)
    }
    if "math" in checks:
        cv_scores = np.array(
            [
                score(dict(zip(SIGNALS, x, strict=True)), folds[h])
                for x, h in zip(data.x, data.half, strict=True)
            ]
        )
        designs["cascade: suspicion, shipped (in-sample)"] = (
            _run(data, checks, grading, times=took["graded"]),
            np.array([score(dict(zip(SIGNALS, x, strict=True))) for x in data.x]),
        )
        designs["cascade: suspicion, 2-fold CV"] = (
            _run(data, checks, grading, lambda h: folds[h], data.half.astype(float)),
            cv_scores,
        )
        designs["cascade: suspicion, equal weights"] = (
            _run(data, checks, grading, lambda h: equal),
            np.array([score(dict(zip(SIGNALS, x, strict=True)), equal) for x in data.x]),
        )
    lines = {"always weak": np.zeros(n, dtype=bool), "always strong": np.ones(n, dtype=bool)}
    table, power = [], {}
    for name, escalate in {
        **lines,
        **{k: v[0] for k, v in designs.items()},
        "oracle cascade": data.wrong > 0,
    }.items():
        if name == "always strong":
            q, c = ref_q, ref_c
        else:
            q, c = data.line(escalate)
        table.append(
            {
                "line": name,
                "quality": round(q, 4),
                "quality_vs_strong": round(q / ref_q, 4),
                "cost_usd": round(c, 6),
                "cost_vs_strong": round(c / ref_c, 4),
            }
        )
    for name, (escalate, scores) in designs.items():
        tpr = float(escalate[data.wrong > 0].mean())
        fpr = float(escalate[data.wrong == 0].mean())
        power[name] = {
            "escalated": round(float(escalate.mean()), 4),
            "tpr": round(tpr, 4),
            "fpr": round(fpr, 4),
            # a graded score: its ROC area; a pass/fail check: the ROC through its one point
            "auc": round(_auc(scores, data.wrong) if scores is not None else (1 + tpr - fpr) / 2, 4),
        }
    base = power["cascade: pass/fail checks"]
    result: dict[str, Any] = {
        "rows": n,
        "checks": list(checks),
        "escalate_share": share,
        "escalate_above": above,
        "table": table,
        "power": power,
        "escalated": base["escalated"],
        "check_tpr": base["tpr"],
        "check_fpr": base["fpr"],
        "check_auc": base["auc"],
        "check_ms_per_answer": {  # median and p99 over the rows, this machine, one thread
            k: {
                "p50": round(float(np.percentile(v, 50)) * 1e3, 4),
                "p99": round(float(np.percentile(v, 99)) * 1e3, 4),
            }
            for k, v in took.items()
            if v
        },
    }
    if "math" in checks:
        result["cv_spread"] = _spread(data, checks, grading, ref_q, ref_c)
    return result


def _ms(seconds: list[float]) -> dict[str, float]:
    """Median and p99 of ``seconds``, in milliseconds."""
    return {q: round(float(np.percentile(seconds, p)) * 1e3, 4) for q, p in (("p50", 50), ("p99", 99))}


def _spread(
    data: _Data, checks: Sequence[str], grading: Callable[[], Grading], ref_q: float, ref_c: float
) -> dict[str, list[float]]:
    """Min, mean and max of the 2-fold cross-validated cascade's quality and cost (vs strong)
    over 10 random halvings."""
    qs, cs = [], []
    for seed in range(10):
        parts = (np.random.default_rng(seed).permutation(len(data.rows)) % 2).astype(float)
        folds = {h: fit(data.x[parts != h], data.wrong[parts != h]) for h in (0, 1)}
        q, c = data.line(_run(data, checks, grading, lambda h, f=folds: f[h], parts))  # type: ignore[misc]
        qs.append(q / ref_q)
        cs.append(c / ref_c)

    def stats(v: list[float]) -> list[float]:
        return [round(min(v), 4), round(sum(v) / len(v), 4), round(max(v), 4)]

    return {"quality_vs_strong": stats(qs), "cost_vs_strong": stats(cs)}


def length_signals(multi: Path) -> dict[str, Any]:
    """What other math-like sets can check (they have no answer texts, only lengths and labels):
    the median, min and max over models of the AUC with which ``long_answer`` (MMLU-Pro math:
    its output lengths) and ``long_question`` predict a model's failure."""

    def summary(aucs: list[float]) -> dict[str, Any]:
        ok = sorted(a for a in aucs if a == a)
        return {
            "models": len(ok),
            "median": round(float(np.median(ok)), 3),
            "min": round(ok[0], 3),
            "max": round(ok[-1], 3),
        }

    out: dict[str, Any] = {}
    pro = [orjson.loads(x) for x in (multi / "mmlu-pro.jsonl").read_bytes().splitlines() if x.strip()]
    pro = [r for r in pro if r["category"] == "math"]
    answer, question = [], []
    for model in sorted({m for r in pro for m in r["correct"]}):
        rows = [r for r in pro if model in r["correct"] and model in r.get("output_chars", {})]
        wrong = np.array([not r["correct"][model] for r in rows], dtype=float)
        if min(wrong.sum(), len(wrong) - wrong.sum()) < 10:  # too few of one kind for an AUC
            continue
        answer.append(
            _auc(
                np.array([signals("x" * r["output_chars"][model], r["prompt"])["long_answer"] for r in rows]),
                wrong,
            )
        )
        question.append(_auc(np.array([signals("", r["prompt"])["long_question"] for r in rows]), wrong))
    out["mmlu-pro math: long_answer"] = summary(answer)
    out["mmlu-pro math: long_question"] = summary(question)
    dc = [orjson.loads(x) for x in (multi / "dcrouter.jsonl").read_bytes().splitlines() if x.strip()]
    for task in ("gsm8k", "math"):
        rows = [r for r in dc if r["task"] == task]
        lengths = np.array([signals("", r["prompt"])["long_question"] for r in rows])
        aucs = []
        for model in sorted({m for r in rows for m in r["correct"]}):
            have = np.array([model in r["correct"] for r in rows])
            wrong = np.array([not r["correct"].get(model, True) for r in rows], dtype=float)
            aucs.append(_auc(lengths[have], wrong[have]))
        out[f"dcrouter {task}: long_question"] = summary(aucs)
    return out


def fit_all(path: Path) -> Coefficients:
    """The coefficients fitted on every row of ``path`` (how ``DEFAULT`` was made)."""
    data = _Data(path)
    return fit(data.x, data.wrong)


__all__ = ["DEFAULT", "evaluate", "fit", "fit_all"]
