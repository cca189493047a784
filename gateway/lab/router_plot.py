"""The cost-quality curve of `switchyard eval router` as a PNG (matplotlib, imported here only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.lab.router_metrics import CostPoint


def plot_cost_quality(curves: dict[str, list[CostPoint]], report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cost, ax_calls) = plt.subplots(1, 2, figsize=(12, 5))
    for name, points in curves.items():
        ax_cost.plot([p.dollars for p in points], [p.accuracy for p in points], label=name, linewidth=1.4)
        ax_calls.plot([p.strong_pct for p in points], [p.accuracy for p in points], label=name, linewidth=1.4)
    rows = {r["router"]: r for r in report["routers"]}
    weak, strong = rows["always-weak"], rows["always-strong"]
    ax_cost.plot(
        [weak["cost"], strong["cost"]],
        [weak["accuracy"], strong["accuracy"]],
        "k:",
        label="random (expected)",
    )
    ax_calls.plot([0, 100], [weak["accuracy"], strong["accuracy"]], "k:", label="random (expected)")
    for ax in (ax_cost, ax_calls):
        ax.axhline(
            report["strong_accuracy"], color="red", linestyle="--", linewidth=0.8, label="always-strong"
        )
        ax.axhline(report["weak_accuracy"], color="grey", linestyle="--", linewidth=0.8, label="always-weak")
        ax.axhline(
            0.95 * report["strong_accuracy"],
            color="green",
            linestyle="-.",
            linewidth=0.8,
            label="95% of strong",
        )
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    ax_cost.set_xlabel(f"cost (USD, {report['n']} prompts)")
    ax_calls.set_xlabel("strong model calls (%)")
    ax_cost.set_title("cost vs quality")
    ax_calls.set_title("strong calls vs quality")
    ax_calls.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
