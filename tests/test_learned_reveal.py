"""`switchyard eval routing --reveal`: the diagnostic that shows the learner more outcomes than
it served (what bandit feedback costs the rule), with what it owes still counted on what it served,
and the report's count of tasks at their floor."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.lab.learned_designs import Revealing
from gateway.lab.learned_eval import Row, Stream, replay, revealed
from gateway.routing.learned import Learner, LearnSettings


def _stream(n: int = 1200) -> Stream:
    """Two tasks: the cheap model as good as the dear one on "easy", useless on "hard"; a
    third model, "mid", priced between them and middling everywhere."""
    rng = random.Random(3)
    truth = {"easy": {"cheap": 0.9, "mid": 0.6, "dear": 0.9}, "hard": {"cheap": 0.1, "mid": 0.6, "dear": 0.9}}
    costs = {"cheap": 0.001, "mid": 0.004, "dear": 0.01}
    rows = []
    for i in range(n):
        task = "easy" if i % 2 else "hard"
        rows.append(Row(task, {m: float(rng.random() < p) for m, p in truth[task].items()}, costs))
    models = ["cheap", "dear", "mid"]
    return Stream(rows, models, {"cheap": 1.0, "mid": 4.0, "dear": 10.0}, {})


def _written(path: Path, s: Stream) -> Path:
    """``s`` as a stream file for the CLI (its models line, then a row per request)."""
    with path.open("w") as fh:
        fh.write(json.dumps({"models": {m: {"price": p} for m, p in s.price.items()}}) + "\n")
        for i, r in enumerate(s.rows):
            fh.write(
                json.dumps({"task": r.task, "prompt": f"p{i}", "scores": r.scores, "costs": r.costs}) + "\n"
            )
    return path


def test_revealed_models() -> None:
    s = _stream(10)
    assert revealed(s, "served", "dear") == frozenset()
    assert revealed(s, "cheaper", "dear") == {"cheap", "mid"}
    assert revealed(s, "cheaper", "mid") == {"cheap"}
    assert revealed(s, "all", "dear") == {"cheap", "mid", "dear"}


def test_revealed_outcomes_teach_but_are_not_owed() -> None:
    """Outcomes shown but not served feed the evidence, never the route's bank: a shown model
    that fails every time leaves what the route owes unchanged."""
    learner = Revealing(["cheap", "dear"], {"cheap": 1.0, "dear": 10.0})
    learner.served_n["t"] += 10
    learner.served_s += 9.0
    for _ in range(10):
        learner.observe("t", "dear", 1.0)
        learner.observe("t", "cheap", 0.0)  # shown, not served
    assert learner._served(["t"]) == ({"t": 10.0}, 9.0)
    assert learner.estimate("t", "cheap").n == 10  # but it is evidence
    plain = Learner(["cheap", "dear"], {"cheap": 1.0, "dear": 10.0})
    for _ in range(10):
        plain.observe("t", "dear", 1.0)
        plain.observe("t", "cheap", 0.0)
    assert plain._served(["t"]) == ({"t": 20.0}, 10.0)  # the real route: what it observed, it served


def test_more_information_buys_cheaper_routes() -> None:
    """Shown every outcome, the rule learns the per-task answer (cheap on easy, dear on hard)
    with no exploration loss: cheaper than bandit feedback at its quality or better."""
    s, settings = _stream(), LearnSettings()
    bandit = [replay(s, settings, seed) for seed in range(3)]
    full = [replay(s, settings, seed, shown=revealed(s, "all", "dear")) for seed in range(3)]
    cost = lambda runs: sum(r.cost for r in runs) / len(runs)  # noqa: E731
    quality = lambda runs: sum(r.quality for r in runs) / len(runs)  # noqa: E731
    assert cost(full) < cost(bandit)
    assert quality(full) >= 0.95 * 0.9


def test_cli_reveal_and_floor_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stream(400)
    path = _written(tmp_path / "s.jsonl", s)
    assert (
        main(["eval", "routing", "--stream", str(path), "--seeds", "2", "--reveal", "cheaper", "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["table"][-1]["line"].endswith("shown cheaper: 2 models' outcomes")
    floor = result["tasks_at_floor"]
    assert floor["of"] == 4 and 0 <= floor["met"] <= 4  # 2 tasks x 2 orderings, 200 requests each
    runs = result["orderings"]
    assert len(runs) == 2 and all(r["believed_best"] in s.models for r in runs)
    assert main(["eval", "routing", "--stream", str(path), "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "at the floor or above" in out and "orderings under the quality target:" in out


def test_per_prompt_takes_no_reveal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps({"task": "t", "prompt": "p", "scores": {"a": 1.0}, "costs": {"a": 0.1}}) + "\n"
    )
    assert (
        main(["eval", "routing", "--stream", str(path), "--per-prompt", "difficulty", "--reveal", "all"]) == 2
    )
    assert "--per-prompt takes no --reveal or --design" in capsys.readouterr().err


def test_every_design_replays_and_the_plain_one_is_the_rule() -> None:
    """Each design variant of `eval routing --design` runs a short replay; a design that
    changes nothing (no settings, no hook, the plain learner) gives the route's own figures."""
    from gateway.lab.learned_designs import DESIGNS, Design

    s = _stream(300)
    plain = replay(s, LearnSettings(), 1)
    assert replay(s, LearnSettings(), 1, design=Design()) == plain
    for name, design in DESIGNS.items():
        run = replay(s, design.apply(LearnSettings()), 1, design=design)
        assert 0.0 < run.quality <= 1.0 and run.cost > 0, name


def test_probes_pay_and_teach_but_are_not_owed() -> None:
    """Probes add their cost and evidence on the cheaper model; the route's bank counts only
    what it served."""
    from gateway.lab.learned_designs import DESIGNS

    s = _stream(600)
    design = DESIGNS["probes-true"]
    bare = replay(s, LearnSettings(), 2)
    probed = replay(s, LearnSettings(), 2, design=design)
    assert probed.cost != bare.cost
    learner = design.learner(s.models, s.price, s.ability, LearnSettings())
    assert design.after is not None
    extra = design.after(
        learner, "easy", "dear", 1.0, {"cheap": 1.0, "mid": 0.0, "dear": 1.0}, s.rows[0].costs
    )
    assert extra in (0.0, s.rows[0].costs["cheap"], s.rows[0].costs["mid"])
    assert learner._served(["easy"]) == ({"easy": 1.0}, 1.0)


def test_cli_design(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = _stream(200)
    path = _written(tmp_path / "s.jsonl", s)
    assert (
        main(["eval", "routing", "--stream", str(path), "--seeds", "1", "--design", "screen", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["table"][-1]["line"].endswith("design screen")
    assert main(["eval", "routing", "--stream", str(path), "--design", "nope"]) == 2
    assert "--design: one of" in capsys.readouterr().err
    assert main(["eval", "routing", "--stream", str(path), "--design", "screen", "--reveal", "all"]) == 2


def test_routing_stream_abilities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`eval routing-stream --abilities` puts each model's accuracy from models.json in the
    stream's models line (the catalog prior the replay starts from)."""
    data = tmp_path / "routing-multi"
    data.mkdir()
    models = {
        "a": {"input_price": 0.1, "output_price": 0.1, "accuracy": 0.4},
        "b": {"input_price": 1, "output_price": 1},
    }
    (data / "models.json").write_text(json.dumps({"dcrouter": {"models": models}}))
    row = {"prompt": "q", "task": "t", "score": {"a": 1.0, "b": 0.0}}
    (data / "dcrouter.jsonl").write_text(json.dumps(row) + "\n")
    for flag, want in (([], {}), (["--abilities"], {"a": 0.4})):
        out = tmp_path / "s.jsonl"
        assert (
            main(
                [
                    "eval",
                    "routing-stream",
                    "--source",
                    "dcrouter",
                    "--data",
                    str(data),
                    "--out",
                    str(out),
                    *flag,
                ]
            )
            == 0
        )
        capsys.readouterr()
        meta = json.loads(out.read_text().splitlines()[0])["models"]
        assert {m: v["ability"] for m, v in meta.items() if "ability" in v} == want
