"""The verifier cascade on data with answers (``../shared/data/routing/gsm8k-dev.jsonl``: the
weak and strong models' real answers and whether each is right): the weak model answers every
prompt, its answer is checked (routing/verify.py), and a failed check escalates to the strong
model, paid on top. Reported beside always-weak, always-strong and the oracle cascade (escalate
exactly the wrong answers), with the check's power to predict the weak answer's failure.

Prices (USD per 1M input/output tokens, list): the weak model Mixtral-8x7B-Instruct at 0.60/0.60
(Together), the strong GPT-4-1106-preview at 10/30 (OpenAI); tokens = characters / 4."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.routing.verify import check

WEAK_PRICE: Final = (0.60, 0.60)
STRONG_PRICE: Final = (10.0, 30.0)


def _cost(prompt: str, answer: str, price: tuple[float, float]) -> float:
    return (len(prompt) / 4 * price[0] + len(answer) / 4 * price[1]) / 1e6


def evaluate(path: Path, checks: Sequence[str] = ("math", "refusal")) -> dict[str, Any]:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    totals = {k: [0.0, 0.0] for k in ("always weak", "always strong", "cascade", "oracle cascade")}
    tp = fp = fn = tn = 0
    for r in rows:
        weak = _cost(r["prompt"], r["weak_response"], WEAK_PRICE)
        strong = _cost(r["prompt"], r["strong_response"], STRONG_PRICE)
        completion = {"choices": [{"message": {"content": r["weak_response"]}}]}
        request = {"messages": [{"role": "user", "content": r["prompt"]}]}
        escalate = check(checks, completion, request) is not None
        wrong = not r["weak_correct"]
        tp, fp, fn, tn = (
            tp + (escalate and wrong),
            fp + (escalate and not wrong),
            fn + (not escalate and wrong),
            tn + (not escalate and not wrong),
        )
        lines = {
            "always weak": (r["weak_correct"], weak),
            "always strong": (r["strong_correct"], strong),
            "cascade": (
                r["strong_correct"] if escalate else r["weak_correct"],
                weak + (strong if escalate else 0),
            ),
            "oracle cascade": (r["strong_correct"] if wrong else True, weak + (strong if wrong else 0)),
        }
        for k, (ok, cost) in lines.items():
            totals[k][0] += float(ok)
            totals[k][1] += cost
    n = len(rows)
    ref_q, ref_c = totals["always strong"][0] / n, totals["always strong"][1]
    table = [
        {
            "line": k,
            "quality": round(q / n, 4),
            "quality_vs_strong": round(q / n / ref_q, 4),
            "cost_usd": round(c, 6),
            "cost_vs_strong": round(c / ref_c, 4),
        }
        for k, (q, c) in totals.items()
    ]
    tpr = tp / max(1, tp + fn)
    fpr = fp / max(1, fp + tn)
    return {
        "rows": n,
        "checks": list(checks),
        "table": table,
        "escalated": round((tp + fp) / n, 4),
        "check_tpr": round(tpr, 4),
        "check_fpr": round(fpr, 4),
        "check_auc": round((1 + tpr - fpr) / 2, 4),  # one threshold: the ROC through (fpr, tpr)
    }
