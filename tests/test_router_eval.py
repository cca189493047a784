"""Router metrics (APGR, CPT) against a hand-computed example, the cost curve, and
`switchyard eval router` end to end on a scores file (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cli import main
from gateway.lab.router_metrics import (
    cost_at_quality,
    cost_curve,
    quantile_thresholds,
    routellm_curve,
    router_metrics,
)

# Five prompts. Hand computation (RouteLLM's procedure, see gateway/lab/router_metrics.py):
# weak accuracy 40%, strong 80%. The 11 quantile thresholds of the scores route to strong:
#   t = 0.1 (q0)            -> all 5          -> 80% acc, 100% strong
#   t = 0.18, 0.26          -> top 4          -> 80%,  80%
#   t = 0.36, 0.48, 0.6     -> top 3          -> 80%,  60%
#   t = 0.68, 0.76          -> top 2          -> 80%,  40%
#   t = 0.82, 0.86          -> top 1          -> 60%,  20%
#   t = 0.9 (q1, strict >)  -> none           -> 40%,   0%
# AUC = 0.2*(40+60)/2 + 0.2*(60+80)/2 + 0.6*80 = 10 + 14 + 48 = 72; weak AUC 40, strong AUC 80
# APGR = (72 - 40) / (80 - 40) = 0.8
# CPT(50%): accuracy 60 first reached at 20% strong calls -> 20
# CPT(80%): accuracy 72 lies between (20%, 60) and (40%, 80) -> 20 + 20 * 12/20 = 32
SCORES = np.array([0.9, 0.8, 0.6, 0.3, 0.1])
WEAK = np.array([0.0, 0.0, 1.0, 1.0, 0.0])
STRONG = np.array([1.0, 1.0, 1.0, 1.0, 0.0])


def test_quantile_thresholds_are_pandas_qcut_edges() -> None:
    got = quantile_thresholds(SCORES)
    want = [0.1, 0.18, 0.26, 0.36, 0.48, 0.6, 0.68, 0.76, 0.82, 0.86, 0.9]
    assert got == pytest.approx(want)


def test_curve_points_by_hand() -> None:
    curve = routellm_curve(SCORES, WEAK, STRONG)
    pairs = [(round(p.strong_pct, 6), round(p.accuracy, 6)) for p in curve]
    assert pairs == [
        (0.0, 40.0),
        (20.0, 60.0),
        (20.0, 60.0),
        (40.0, 80.0),
        (40.0, 80.0),
        (60.0, 80.0),
        (60.0, 80.0),
        (60.0, 80.0),
        (80.0, 80.0),
        (80.0, 80.0),
        (100.0, 80.0),
    ]


def test_apgr_and_cpt_golden() -> None:
    m = router_metrics(SCORES, WEAK, STRONG)
    assert m.apgr == pytest.approx(0.8)
    assert m.cpt50 == pytest.approx(20.0)
    assert m.cpt80 == pytest.approx(32.0)


def test_reversed_scores_are_worse_than_random() -> None:
    assert router_metrics(-SCORES, WEAK, STRONG).apgr < 0.5 < router_metrics(SCORES, WEAK, STRONG).apgr


def test_random_scores_average_about_half() -> None:
    rng = np.random.default_rng(1)
    weak = (rng.random(2000) < 0.6).astype(float)
    strong = np.maximum(weak, (rng.random(2000) < 0.5).astype(float))
    apgrs = [router_metrics(rng.random(2000), weak, strong).apgr for _ in range(20)]
    assert 0.45 < float(np.mean(apgrs)) < 0.55


def test_cost_curve_and_cost_at_quality() -> None:
    weak_cost, strong_cost = np.ones(5), np.full(5, 10.0)
    points = cost_curve(SCORES, WEAK, STRONG, weak_cost, strong_cost)
    assert [(p.strong_pct, p.accuracy, p.dollars) for p in points] == [
        (0.0, 40.0, 5.0),
        (20.0, 60.0, 14.0),
        (40.0, 80.0, 23.0),
        (60.0, 80.0, 32.0),
        (80.0, 80.0, 41.0),
        (100.0, 80.0, 50.0),
    ]
    assert cost_at_quality(points, 0.95 * 80.0) == 23.0  # two strong calls reach 76%
    assert cost_at_quality(points, 81.0) is None


def test_cost_curve_keeps_tied_scores_together() -> None:
    points = cost_curve(np.array([0.5, 0.5, 0.1]), np.zeros(3), np.ones(3), np.ones(3), np.full(3, 2.0))
    assert [p.strong_pct for p in points] == pytest.approx([0.0, 200 / 3, 100.0])


def _write(tmp_path: Path, with_responses: bool) -> tuple[Path, Path]:
    data, scores = tmp_path / "data.jsonl", tmp_path / "scores.jsonl"
    with data.open("w") as fh:
        for i in range(5):
            row = {
                "prompt": f"question number {i}",
                "weak_correct": bool(WEAK[i]),
                "strong_correct": bool(STRONG[i]),
            }
            if with_responses:
                row |= {"weak_response": "short", "strong_response": "a much longer answer " * 5}
            fh.write(json.dumps(row) + "\n")
    scores.write_text("".join(json.dumps({"score": float(s)}) + "\n" for s in SCORES))
    return data, scores


def test_eval_router_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, scores = _write(tmp_path, with_responses=True)
    png = tmp_path / "curve.png"
    code = main(
        ["eval", "router", "--data", str(data), "--scores", str(scores), "--json", "--plot", str(png)]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["router"].split(" ")[0]: r for r in report["routers"]}
    assert rows["classifier"]["apgr"] == pytest.approx(0.8)
    assert rows["classifier"]["cpt50"] == pytest.approx(20.0)
    assert rows["classifier"]["cpt80"] == pytest.approx(32.0)
    assert rows["oracle"]["apgr"] > rows["classifier"]["apgr"] - 1e-9
    assert {"random", "prompt-length", "always-weak", "always-strong"} <= set(rows)
    assert report["weak_accuracy"] == 40.0 and report["strong_accuracy"] == 80.0
    assert "counted" in report["output_tokens"]
    assert rows["always-strong"]["cost"] > rows["always-weak"]["cost"] > 0
    assert rows["always-weak"]["cost"] <= rows["classifier"]["cost_at_95"] <= rows["always-strong"]["cost"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_router_cli_text_says_output_tokens_are_estimated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, scores = _write(tmp_path, with_responses=False)
    assert main(["eval", "router", "--data", str(data), "--scores", str(scores)]) == 0
    out = capsys.readouterr().out
    assert "APGR" in out and "CPT(50%)" in out and "estimated" in out
    assert "always-strong" in out and "oracle" in out


def test_eval_router_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    assert main(["eval", "router", "--data", str(bad)]) == 2
    assert "weak_correct" in capsys.readouterr().err
    data, scores = _write(tmp_path, with_responses=False)
    scores.write_text('{"score": 1}\n')
    assert main(["eval", "router", "--data", str(data), "--scores", str(scores)]) == 2
    assert "1 scores for 5" in capsys.readouterr().err
