"""`switchyard eval semcache` and `switchyard train semcache` on small labelled files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cache.verifier import load_verifier
from gateway.cli import main

PAIRS = [
    ("How can I reset my password?", "How do I reset my password?", 1),
    ("How do I learn Python?", "What is the best way to learn Python?", 1),
    ("What is 17 * 23?", "What is 17 * 24?", 0),
    ("What is the capital of France?", "What is the capital of Germany?", 0),
    ("How do I bake bread?", "how do i bake bread", 1),
    ("Why is the sky blue?", "Why isn't the sky blue?", 0),
    ("Who wrote Hamlet?", "What is the tallest mountain on Earth?", 0),
    ("How can I lose weight fast?", "What is the fastest way to lose weight?", 1),
]


def write_pairs(path: Path, pairs: list[tuple[str, str, int]]) -> Path:
    path.write_text("".join(json.dumps({"text_a": a, "text_b": b, "label": y}) + "\n" for a, b, y in pairs))
    return path


def test_eval_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    plot = tmp_path / "pr.png"
    assert main(["eval", "semcache", "--pairs", str(pairs), "--json", "--plot", str(plot)]) == 0
    result = json.loads(capsys.readouterr().out.strip())
    assert set(result) == {"hit_rate", "precision", "recall", "n"} and result["n"] == len(PAIRS)
    assert result["precision"] == 1.0  # no trap was answered from the cache
    assert 0 < result["recall"] <= 1 and 0 < result["hit_rate"] <= 0.5
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_prints_the_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS)
    assert main(["eval", "semcache", "--pairs", str(pairs)]) == 0
    out = capsys.readouterr().out
    assert "default: hit rate" in out and "cosine only" in out
    assert "label check: 1 pairs have identical words" in out and "0.0% of them" in out
    assert len([line for line in out.splitlines() if line.startswith("0.")]) >= 19


def test_eval_of_an_empty_split_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", [])
    assert main(["eval", "semcache", "--pairs", str(pairs)]) == 1
    assert "no pairs" in capsys.readouterr().err


def test_train_writes_loadable_weights(tmp_path: Path) -> None:
    many = [(f"{a} ({i})", f"{b} ({i})", y) for i in range(12) for a, b, y in PAIRS]
    pairs = write_pairs(tmp_path / "pairs.jsonl", many)
    out = tmp_path / "weights.json"
    assert (
        main(["train", "semcache", "--pairs", str(pairs), "--out", str(out), "--target-precision", "0.9"])
        == 0
    )
    verifier = load_verifier(out)
    assert verifier.meta["command"].startswith("switchyard train semcache --pairs pairs.jsonl")
    assert verifier.meta["train_pairs"] > 0 and 0 < verifier.threshold <= 1


def test_eval_stream_runs_every_mode_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = [("How do I reset my password?", "How can I change my password?", 1),
             ("How can I reset my password?", "How do I reset my email password?", 0)]  # fmt: skip
    pairs = write_pairs(tmp_path / "pairs.jsonl", PAIRS + extra)
    assert (
        main(["eval", "semcache", "--pairs", str(pairs), "--stream", "--min-component", "2", "--json"]) == 0
    )
    rows = json.loads(capsys.readouterr().out.strip())
    assert [(r["mode"], r["judge_recall"]) for r in rows] == [
        ("static", None), ("online", 1.0), ("online", 0.7), ("online+aliases", 1.0), ("online+aliases", 0.7),
    ]  # fmt: skip
    assert all(r["queries"] == 18 and r["wrong"] == 0 for r in rows)  # the traps never hit
    assert main(["eval", "semcache", "--pairs", str(pairs), "--stream", "--min-component", "2"]) == 0
    out = capsys.readouterr().out
    assert "| static | - |" in out and "| online+aliases | 0.7 |" in out
