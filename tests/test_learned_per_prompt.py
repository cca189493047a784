"""The learned route with a per-prompt scorer on its mixes (gateway/lab/learned_per_prompt.py,
`switchyard eval routing --per-prompt`): the online quantile, the mix assignment on synthetic
streams, and the command (a fake embedder; the real data's runs are in docs/learned-routing.md)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gateway.cli import build_parser, main
from gateway.lab.learned_eval import Row, Stream, replay
from gateway.lab.learned_per_prompt import RecentQuantile, auc, difficulty_score, paired
from gateway.routing.learned import LearnSettings


def _stream(n: int = 3000, hard: float = 0.3, seed: int = 1) -> tuple[Stream, dict[str, float]]:
    """Two models on three tasks: the cheap one fails exactly the hard prompts (30%), the dear
    one fails 3% at random; and each prompt's hardness (a perfect per-prompt score)."""
    rng = random.Random(seed)
    rows, flag = [], {}
    for i in range(n):
        is_hard = rng.random() < hard
        scores = {"cheap": 0.0 if is_hard else 1.0, "dear": 1.0 if rng.random() < 0.97 else 0.0}
        rows.append(Row(f"t{i % 3}", scores, {"cheap": 0.1, "dear": 1.0}, f"prompt {i}"))
        flag[f"prompt {i}"] = float(is_hard)
    return Stream(rows, ["cheap", "dear"], {"cheap": 0.1, "dear": 1.0}, {}), flag


def test_quantile_sends_the_top_share_up() -> None:
    q = RecentQuantile(window=200)
    rng = random.Random(0)
    ups = [(v, q.top(v, 0.25)) for v in (rng.random() for _ in range(2000))]
    late = ups[200:]
    assert abs(sum(u for _, u in late) / len(late) - 0.25) < 0.04
    # what goes up is the high values: the lowest of those sent up is above most of those kept
    assert np.median([v for v, u in late if u]) > 0.7 > np.median([v for v, u in late if not u])


def test_quantile_splits_ties_by_the_share() -> None:
    q = RecentQuantile(window=200)
    ups = sum(q.top(0.5, 0.3) for _ in range(1000))
    assert 270 <= ups <= 330


def test_auc() -> None:
    assert auc([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert auc([0.0], [1.0]) == 0.0
    assert auc([1.0, 1.0], [1.0]) == 0.5


def test_a_pick_that_keeps_the_choice_is_the_plain_replay() -> None:
    stream, _ = _stream(n=800)
    plain = replay(stream, LearnSettings(), 3)
    kept = replay(stream, LearnSettings(), 3, lambda _row, choice, _learner: choice.model)
    assert (kept.quality, kept.cost, kept.explored) == (plain.quality, plain.cost, plain.explored)


def test_a_perfect_score_pays_and_a_random_one_does_not() -> None:
    stream, hard = _stream()
    perfect = paired(stream, LearnSettings(), difficulty_score(hard), seeds=2)
    assert perfect["mix_share"] > 0.1  # the plan mixes the two models
    assert perfect["auc_cheaper_fails"] == 1.0
    # the hard prompts go to the dear model: the learner sees the cheap one do better and moves
    # traffic to it, at the same quality target
    assert perfect["difference"]["cost_vs_best"] < -0.05
    assert perfect["difference"]["quality_vs_best"] > -0.01
    rng = random.Random(5)
    noise = {p: rng.random() for p in hard}
    rand = paired(stream, LearnSettings(), difficulty_score(noise), seeds=2)
    assert abs(rand["auc_cheaper_fails"] - 0.5) < 0.1
    assert abs(rand["difference"]["cost_vs_best"]) < 0.02
    assert abs(rand["difference"]["quality_vs_best"]) < 0.01
    # the command's own control line (a random score fixed per prompt) makes as little difference
    for k in ("quality_vs_best", "cost_vs_best"):
        assert abs(perfect["control_difference"][k]) < 0.02
    # the same plain line: the two replays are paired
    assert rand["table"][0] == perfect["table"][0]


def test_the_flag_parses() -> None:
    args = build_parser().parse_args(["eval", "routing", "--stream", "s.jsonl", "--per-prompt", "difficulty"])
    assert args.per_prompt == "difficulty" and args.scorer_weights is None
    assert build_parser().parse_args(["eval", "routing", "--stream", "s"]).per_prompt is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "routing", "--stream", "s", "--per-prompt", "oracle"])


class _FakeEmbedder:
    name, dim = "minilm-l6-onnx-int8", 384

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int(hashlib.sha1(t.encode()).hexdigest()[:8], 16)
            v = np.random.default_rng(seed).standard_normal(self.dim)
            out[i] = v / np.linalg.norm(v)
        return out


def test_the_command_prints_the_paired_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gateway.cache.embedder as embedder_module

    monkeypatch.setattr(embedder_module, "load_embedder", lambda _backend="auto": _FakeEmbedder())
    stream, _ = _stream(n=600)
    path = tmp_path / "s.jsonl"
    path.write_text(
        "".join(json.dumps({"task": r.task, "prompt": r.prompt, "scores": r.scores, "costs": r.costs}) + "\n"
                for r in stream.rows)
    )  # fmt: skip
    argv = ["eval", "routing", "--stream", str(path), "--seeds", "1", "--per-prompt", "classifier"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["line"] for r in result["table"]] == [
        "learned",
        "learned + per-prompt",
        "learned + random score",
        "learned + hindsight",
    ]
    assert result["scorer"]["trained_on"] == ["gsm8k-dev.jsonl", "mmlu.jsonl"]
    assert result["scorer"]["ms_per_prompt"]["p50"] > 0
    assert main(argv) == 0
    assert "per-prompt minus plain" in capsys.readouterr().out


def test_the_shipped_difficulty_weights_saw_the_streams_prompts() -> None:
    """Why the command retrains the difficulty design: the shipped weights' training files
    include the routing-multi sources the streams are built from."""
    from gateway.lab.per_prompt_scorers import training_files

    names = {f["name"] for f in training_files(None)}
    assert {"dcrouter.jsonl", "mmlu-pro.jsonl"} <= names
