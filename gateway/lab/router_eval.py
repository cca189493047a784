"""`switchyard eval router`: the report over one labelled file — RouteLLM metrics for the
classifier and the baselines, dollars at a price table, and the cost at 95% of strong quality."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.lab.router_metrics import (
    CostPoint,
    cost_at_quality,
    cost_curve,
    oracle_scores,
    router_metrics,
)

F64 = npt.NDArray[np.float64]
RANDOM_SEEDS = 10  # the random baseline is averaged over this many seeded draws
DEFAULT_OUTPUT_TOKENS = 256  # per answer, when a file has no responses to count


@dataclass(frozen=True, slots=True)
class PriceTable:
    """USD per 1M tokens."""

    weak_name: str = "mixtral-8x7b-instruct"
    weak_input: float = 0.60
    weak_output: float = 0.60
    strong_name: str = "gpt-4-1106-preview"
    strong_input: float = 10.0
    strong_output: float = 30.0

    def as_dict(self) -> dict[str, Any]:
        return {
            self.weak_name: {"input": self.weak_input, "output": self.weak_output},
            self.strong_name: {"input": self.strong_input, "output": self.strong_output},
            "unit": "USD per 1M tokens",
        }


@dataclass(frozen=True, slots=True)
class EvalData:
    weak: F64  # 0/1 correctness
    strong: F64
    input_tokens: F64
    weak_output_tokens: F64
    strong_output_tokens: F64
    output_tokens_source: str  # "responses" (counted) or "estimate (N per answer)"
    prompt_chars: F64


def _summary(
    name: str, scores: F64 | None, data: EvalData, weak_cost: F64, strong_cost: F64, target_acc: float
) -> tuple[dict[str, Any], list[CostPoint]]:
    row: dict[str, Any] = {"router": name}
    if scores is None:
        return row, []
    m = router_metrics(scores, data.weak, data.strong)
    points = cost_curve(scores, data.weak, data.strong, weak_cost, strong_cost)
    row.update(
        apgr=round(m.apgr, 4),
        cpt50=round(m.cpt50, 2),
        cpt80=round(m.cpt80, 2),
        cost_at_95=_money(cost_at_quality(points, target_acc)),
        curve=[{"strong_pct": p.strong_pct, "accuracy": p.accuracy} for p in m.curve],
    )
    return row, points


def _money(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.6g}")


def evaluate(scores: F64, data: EvalData, prices: PriceTable, quality: float = 0.95) -> dict[str, Any]:
    """Everything `eval router` prints, as one JSON-able dict."""
    n = len(scores)
    weak_cost = (data.input_tokens * prices.weak_input + data.weak_output_tokens * prices.weak_output) / 1e6
    strong_cost = (
        data.input_tokens * prices.strong_input + data.strong_output_tokens * prices.strong_output
    ) / 1e6
    weak_acc, strong_acc = float(data.weak.mean() * 100), float(data.strong.mean() * 100)
    target = quality * strong_acc
    rows, curves = [], {}
    candidates: list[tuple[str, F64]] = [
        ("classifier", scores),
        ("prompt-length", data.prompt_chars),
        ("oracle", oracle_scores(data.weak, data.strong)),
    ]
    for name, s in candidates:
        row, points = _summary(name, s, data, weak_cost, strong_cost, target)
        rows.append(row)
        curves[name] = points
    rng = np.random.default_rng(0)
    draws = [
        _summary("random", rng.random(n), data, weak_cost, strong_cost, target)[0]
        for _ in range(RANDOM_SEEDS)
    ]
    rnd: dict[str, Any] = {"router": f"random (mean of {RANDOM_SEEDS} seeds)"}
    for key in ("apgr", "cpt50", "cpt80"):
        rnd[key] = round(float(np.mean([d[key] for d in draws])), 4)
    # random routing at strong share f costs weak + f * (strong - weak) and scores weak + f * gap
    gap = strong_acc - weak_acc
    share = min(1.0, max(0.0, (target - weak_acc) / gap)) if gap > 0 else 1.0
    rnd["cost_at_95"] = _money(float(weak_cost.sum() + share * (strong_cost.sum() - weak_cost.sum())))
    rows.insert(2, rnd)
    rows.append(
        {"router": "always-weak", "accuracy": round(weak_acc, 2), "cost": _money(float(weak_cost.sum()))}
    )
    rows.append(
        {
            "router": "always-strong",
            "accuracy": round(strong_acc, 2),
            "cost": _money(float(strong_cost.sum())),
        }
    )
    return {
        "n": n,
        "weak_accuracy": round(weak_acc, 2),
        "strong_accuracy": round(strong_acc, 2),
        "quality_target": f"{quality:.0%} of strong accuracy = {target:.2f}%",
        "prices": prices.as_dict(),
        "input_tokens": "cl100k_base count of each prompt",
        "output_tokens": data.output_tokens_source,
        "routers": rows,
        "_curves": curves,
    }


def render_text(report: dict[str, Any]) -> str:
    lines = [
        f"n={report['n']}  weak accuracy {report['weak_accuracy']}%  "
        f"strong accuracy {report['strong_accuracy']}%",
        f"cost at {report['quality_target']}; output tokens: {report['output_tokens']}",
        f"prices (USD per 1M tokens in/out): {_prices(report['prices'])}",
        "",
        f"{'router':28s} {'APGR':>7s} {'CPT(50%)':>9s} {'CPT(80%)':>9s} {'$ at 95%':>10s} "
        f"{'acc %':>7s} {'$ total':>9s}",
    ]
    for r in report["routers"]:
        lines.append(
            f"{r['router']:28s} {_f(r.get('apgr'), 3):>7s} {_f(r.get('cpt50'), 1, '%'):>9s} "
            f"{_f(r.get('cpt80'), 1, '%'):>9s} {_money_s(r.get('cost_at_95')):>10s} "
            f"{_f(r.get('accuracy'), 2):>7s} {_money_s(r.get('cost')):>9s}"
        )
    return "\n".join(lines)


def _prices(p: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['input']}/{v['output']}" for k, v in p.items() if isinstance(v, dict))


def _money_s(v: Any) -> str:
    return "-" if v is None else f"${v:.4g}"


def _f(v: Any, digits: int, suffix: str = "", prefix: str = "") -> str:
    return "-" if v is None else f"{prefix}{v:.{digits}f}{suffix}"
