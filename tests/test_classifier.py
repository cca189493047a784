"""The complexity classifier: weights file checks, scoring arithmetic, calibration, the
routing policy's tiers/classifier fields, and the shipped weights on the real embedder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.config.loader import PolicyError, load_policy
from gateway.config.policy import RoutePolicy
from gateway.core.types import Principal
from gateway.routing.classifier import (
    SHIPPED_WEIGHTS,
    ClassifierError,
    ComplexityClassifier,
    vector_space,
)
from gateway.routing.features import FEATURE_NAMES, N_FEATURES, feature_matrix, text_features
from gateway.routing.router import Router

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing"


def shipped() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SHIPPED_WEIGHTS.read_text())
    return doc


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    return path


# ----------------------------------------------------------------------------- features
def test_features_are_finite_and_named() -> None:
    texts = ["", "What is 17 * 23?", "def f(x):\n    return x + 1\n", "A. yes\nB. no\nAnswer:", "é" * 5000]
    m = feature_matrix(texts)
    assert m.shape == (len(texts), N_FEATURES) == (5, len(FEATURE_NAMES))
    assert np.isfinite(m).all()
    assert list(m[1]) == pytest.approx(text_features(texts[1]))
    idx = FEATURE_NAMES.index
    assert m[2, idx("log_code_markers")] > 0 and m[1, idx("log_code_markers")] == 0
    assert m[3, idx("has_choices")] == 1 and m[1, idx("has_choices")] == 0
    assert m[1, idx("log_math_ops")] > 0 and m[1, idx("log_numbers")] > 0


# ----------------------------------------------------------------------------- weights file
def test_shipped_weights_record_the_embedder_and_the_command() -> None:
    doc = shipped()
    assert doc["embedder"] == {"name": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384} | {
        "trained_with": doc["embedder"]["trained_with"]
    }
    assert doc["training"]["command"].startswith("switchyard train router --data ")
    assert SHIPPED_WEIGHTS.stat().st_size < 100_000
    assert len(doc["calibration"]) >= 10


def test_refuses_another_embedder() -> None:
    clf = ComplexityClassifier.load()
    clf.check_embedder("minilm-l6-onnx-int8", 384)  # same model, other backend: same space
    clf.check_embedder("minilm-l6-torch", 384)
    clf.check_embedder("sentence-transformers/all-MiniLM-L6-v2", 384)
    with pytest.raises(ClassifierError, match="all-mpnet-base-v2"):
        clf.check_embedder("sentence-transformers/all-mpnet-base-v2", 384)
    with pytest.raises(ClassifierError, match="768"):
        clf.check_embedder("minilm-l6-torch", 768)
    assert vector_space("minilm-l6-onnx-int8") == vector_space("sentence-transformers/all-MiniLM-L6-v2")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other/1"}, "not a switchyard-router/1"),
        ({"features": ["log_chars"]}, "other text features"),
        ({"embedder": {"name": "x", "dim": 10}}, "shapes"),
        ({"heads": {"strong": {"w_emb": "nope"}}}, "malformed"),
        ({"alpha": None}, "malformed"),
        ({"scale": 0}, "scale"),
    ],
)
def test_bad_weights_files_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ClassifierError, match=message):
        ComplexityClassifier.load(write(tmp_path, shipped() | change))


def test_unreadable_weights(tmp_path: Path) -> None:
    with pytest.raises(ClassifierError, match="cannot read"):
        ComplexityClassifier.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ClassifierError, match="cannot read"):
        ComplexityClassifier.load(tmp_path / "bad.json")


def test_score_is_computed_from_the_stored_weights() -> None:
    doc = shipped()
    rng = np.random.default_rng(0)
    vec = rng.normal(size=384).astype(np.float32)
    vec /= np.linalg.norm(vec)
    text = "How many apples are left if Ann eats 3 of 10?"
    f = (np.array(text_features(text)) - np.array(doc["feature_mean"])) / np.array(doc["feature_std"])

    def p(head: dict[str, Any]) -> float:
        z = float(np.dot(head["w_emb"], vec)) + float(np.dot(head["w_feat"], f)) + head["bias"]
        return float(1 / (1 + np.exp(-z)))

    i = FEATURE_NAMES.index("log_chars")
    raw = doc["alpha"] * p(doc["heads"]["strong"]) - p(doc["heads"]["weak"]) + doc["length_coef"] * f[i]
    want = 1 / (1 + np.exp(-(raw - doc["center"]) / doc["scale"]))
    clf = ComplexityClassifier.load()
    assert clf.score(vec, text) == pytest.approx(want, abs=1e-9)
    batch = clf.score_batch(np.stack([vec, -vec]), [text, "hi"])
    assert batch[0] == pytest.approx(clf.score(vec, text), abs=1e-12)
    assert batch[1] == pytest.approx(clf.score(-vec, "hi"), abs=1e-12)
    with pytest.raises(ClassifierError, match="shape"):
        clf.score(vec[:10], text)


def test_one_prompt_scores_to_the_bit_as_in_a_batch_of_one() -> None:
    """score()'s float path must give score_batch's bits: routing decisions sit on a threshold."""
    clf = ComplexityClassifier.load()
    rng = np.random.default_rng(7)
    texts = ["hi", "", "x" * 3000, "Explain why 17 * 23 = 391.\n(A) yes\n(B) no", "def f(x): return x;"]
    texts += [
        " ".join(rng.choice(["how", "many", "apples", "12", "+", "why", "?", "\n"], size=n))
        for n in range(1, 60)
    ]
    for i, text in enumerate(texts * 4):
        vec = rng.normal(size=384).astype(np.float32) * (1.0 if i % 3 else 40.0)  # saturated heads too
        assert clf.score(vec, text) == clf.score_batch(vec[None, :], [text])[0]


def test_scoring_one_prompt_is_well_under_a_millisecond() -> None:
    clf = ComplexityClassifier.load()
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    text = "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. " * 3
    for _ in range(50):
        clf.score(vec, text)
    times = []
    for _ in range(500):
        t0 = time.perf_counter()
        clf.score(vec, text)
        times.append(time.perf_counter() - t0)
    # p50 budget is 1 ms; this asserts a loose bound on a shared CI machine
    assert float(np.median(times)) < 0.001


def test_calibration_gives_thresholds_for_quality_targets() -> None:
    clf = ComplexityClassifier.load()
    t90, t95, t99 = (clf.threshold_for_quality(q) for q in (0.90, 0.95, 0.99))
    assert t99 <= t95 <= t90  # more quality -> lower threshold -> more strong calls
    p95 = clf.expected(t95)
    assert p95 is not None and p95.quality >= 0.95
    assert clf.threshold_for_quality(1.5) == min(p.threshold for p in clf.calibration)


# ----------------------------------------------------------------------------- policy
POLICY = """
providers:
  p: {{type: openai, base_url: "http://127.0.0.1:9/v1", api_key: sk-test}}
  h: {{type: openai, base_url: "http://127.0.0.1:9/v1", key_required: false}}
models:
  cheap-a: {{provider: p, price: {{input: 0.1, output: 0.4}}}}
  local: {{provider: h, price: {{input: 0.0, output: 0.0}}}}
  strong-a: {{provider: p, price: {{input: 2, output: 8}}}}
  strong-b: {{provider: p, price: {{input: 3, output: 15}}}}
routes:
  auto:
    tiers: {{cheap: [cheap-a], {selfhosted}strong: [strong-a, strong-b]}}
    classifier: {classifier}
    baseline: strong-a
"""


def load(tmp_path: Path, classifier: str, selfhosted: str = "") -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.format(classifier=classifier, selfhosted=selfhosted))
    return load_policy(path)


def test_tiers_derive_targets_and_order_by_decision(tmp_path: Path) -> None:
    policy = load(tmp_path, "{threshold: 0.42}")
    assert [t.model for t in policy.routes["auto"].targets] == ["cheap-a", "strong-a", "strong-b"]
    plan = Router(policy).plan("auto", Principal("t", None, None), "chat")
    assert plan.auto is not None and plan.auto.threshold == 0.42
    strong, tier = plan.auto.decide(0.42)
    assert tier == "strong" and [t.model for t in strong.targets] == ["strong-a", "strong-b", "cheap-a"]
    cheap, tier = plan.auto.decide(0.41)
    assert tier == "cheap" and [t.model for t in cheap.targets] == ["cheap-a", "strong-a", "strong-b"]


def test_self_hosted_tier_goes_first_below_the_threshold(tmp_path: Path) -> None:
    policy = load(tmp_path, "{threshold: 0.5}", selfhosted="self_hosted: [local], ")
    auto = Router(policy).plan("auto", Principal("t", None, None), "chat").auto
    assert auto is not None
    low, tier = auto.decide(0.1)
    assert tier == "self_hosted" and [t.model for t in low.targets] == [
        "local",
        "cheap-a",
        "strong-a",
        "strong-b",
    ]
    high, _ = auto.decide(0.9)
    assert [t.model for t in high.targets] == ["strong-a", "strong-b", "cheap-a", "local"]


def test_quality_target_reads_the_calibration_curve(tmp_path: Path) -> None:
    policy = load(tmp_path, "{quality_target: 0.95}")
    auto = Router(policy).plan("auto", Principal("t", None, None), "chat").auto
    assert auto is not None
    assert auto.threshold == ComplexityClassifier.load().threshold_for_quality(0.95)


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"tiers": {"cheap": ["a"], "strong": ["b"]}, "targets": ["a"]}, "either 'targets' or 'tiers'"),
        ({"targets": ["a"], "classifier": {"threshold": 0.5}}, "needs 'tiers'"),
        ({"tiers": {"strong": ["b"]}, "classifier": {"threshold": 0.5}}, "'cheap' or 'self_hosted'"),
        ({"tiers": {"cheap": ["a"], "strong": ["b"]}, "classifier": {}}, "exactly one"),
        (
            {
                "tiers": {"cheap": ["a"], "strong": ["b"]},
                "classifier": {"threshold": 0.5, "quality_target": 0.9},
            },
            "exactly one",
        ),
        (
            {"tiers": {"cheap": ["a"], "strong": ["b"]}, "classifier": {"threshold": 1.5}},
            "less than or equal",
        ),
    ],
)
def test_bad_route_classifier_settings(route: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutePolicy.model_validate(route)


def test_bad_weights_path_is_a_policy_error(tmp_path: Path) -> None:
    policy = load(tmp_path, f"{{threshold: 0.5, weights: {tmp_path / 'nope.json'}}}")
    with pytest.raises(PolicyError, match=r"routes\.auto\.classifier"):
        Router(policy)


def test_routes_without_a_classifier_have_no_auto(tmp_path: Path) -> None:
    policy = load_policy(Path(__file__).resolve().parents[1] / "policies" / "default.yaml")
    for name in policy.routes:
        plan = Router(policy)._plans[name]
        assert (plan.auto is not None) == (policy.routes[name].classifier is not None)


# ----------------------------------------------------------------------------- the real model
@pytest.fixture(scope="module")
def embedder() -> Any:
    from gateway.cache.embedder import load_embedder

    return load_embedder("torch")


def test_real_embedder_and_shipped_weights_rank_hard_above_easy(embedder: Any) -> None:
    clf = ComplexityClassifier.load()
    clf.check_embedder(getattr(embedder, "space", embedder.name), embedder.dim)
    easy = ["What is the capital of France?", "Say hello.", "What color is the sky on a clear day?"]
    hard = [
        "A train leaves at 3:15 pm at 64 km/h; a second train leaves the same station at 4:05 pm at "
        "82 km/h on a parallel track. At what time, to the nearest minute, does the second train "
        "catch up, and how far from the station are they then? Show each step.",
        "Let G be a finite group of order 2p where p is an odd prime. Prove that G has a normal "
        "subgroup of order p and determine all possible isomorphism classes of G.",
        "A firm's marginal cost is MC = 3q^2 - 12q + 20 and it faces P = 50 - 2q. Find the "
        "profit-maximising quantity and price, then compute the deadweight loss relative to marginal-cost pricing.",
    ]
    scores = clf.score_batch(embedder.encode(easy + hard), easy + hard)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert max(scores[:3]) < min(scores[3:])


def test_shipped_weights_beat_prompt_length_on_gsm8k(embedder: Any) -> None:
    """A regression check of the shipped weights (GSM8K was part of their training data; the
    cross-task figures are in README "Complexity routing")."""
    from gateway.lab.router_metrics import router_metrics

    path = DATA / "gsm8k-dev.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is absent (the routing data lives in ../shared/data, never in the repo)")
    rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()][:300]
    texts = [r["prompt"] for r in rows]
    weak = np.array([float(r["weak_correct"]) for r in rows])
    strong = np.array([float(r["strong_correct"]) for r in rows])
    scores = ComplexityClassifier.load().score_batch(embedder.encode(texts), texts)
    ours = router_metrics(scores, weak, strong).apgr
    by_length = router_metrics(np.array([float(len(t)) for t in texts]), weak, strong).apgr
    assert ours > by_length


# ----------------------------------------------------------------------------- train router
def _training_rows(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        a, b, c = (int(x) for x in rng.integers(2, 999, size=3))
        if i % 2:  # multi-step arithmetic: the weak model fails, the strong one does not
            prompt = (
                f"A shop sells {a} boxes of {b} pens each, then returns {c}. How many pens remain after tax?"
            )
            rows.append({"prompt": prompt, "weak_correct": False, "strong_correct": True, "domain": "math"})
        else:
            prompt = f"Name a colour of the flag number {a}."
            rows.append({"prompt": prompt, "weak_correct": True, "strong_correct": True, "domain": "trivia"})
    return rows


def test_train_router_cli_is_deterministic_and_learns(tmp_path: Path, embedder: Any) -> None:
    from gateway.cli import main

    data = tmp_path / "data"
    data.mkdir()
    (data / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _training_rows(80)))
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        args = ["train", "router", "--data", str(data), "--out", str(out), "--l2", "0.001"]
        args += ["--embedder", "torch", "--workers", "1"]
        assert main(args) == 0
    doc, again = (json.loads(p.read_text()) for p in outs)
    want = f"switchyard train router --data {data} --out {outs[0]} --embedder torch --l2 0.001"
    assert doc["training"]["command"] == want
    again["training"]["command"] = doc["training"]["command"]
    assert doc == again  # same data, same seed: the same model
    assert doc["training"]["n"] == 80 and doc["embedder"]["trained_with"] == "minilm-l6-torch"
    clf = ComplexityClassifier.load(outs[0])
    texts = ["A shop sells 12 boxes of 30 pens each, then returns 7. How many pens remain after tax?"]
    texts.append("Name a colour of the flag number 12.")
    hard, easy = clf.score_batch(embedder.encode(texts), texts)
    assert hard > easy


def test_train_router_refuses_too_little_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _training_rows(10)))
    code = main(
        ["train", "router", "--data", str(tmp_path / "few.jsonl"), "--embedder", "torch", "--workers", "1"]
    )
    assert code == 2 and "need at least 50" in capsys.readouterr().err


def test_policy_simulate_shows_the_order_of_each_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    path = tmp_path / "p.yaml"
    path.write_text(POLICY.format(classifier="{threshold: 0.3}", selfhosted=""))
    assert main(["policy", "simulate", str(path), "--model", "auto", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["classifier"]
    assert got.pop("note").startswith("give --body")  # without a prompt: both orders, no score
    assert got == {
        "threshold": 0.3,
        "strong": ["strong-a", "strong-b", "cheap-a"],
        "cheap": ["cheap-a", "strong-a", "strong-b"],
    }


def _cross_task_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Hard = short arithmetic (weak fails), easy = long trivia: prompt length points the wrong way."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(2, 999, size=2))
        if i % 2:
            row = {"prompt": f"What is {a} * {b} - {a % 7}?", "weak_correct": False, "strong_correct": True}
        else:
            prompt = (
                f"Name one colour that appears on the national flag of country number {a} in the old atlas."
            )
            row = {"prompt": prompt, "weak_correct": True, "strong_correct": True}
        rows.append({**row, "domain": f"d{(i // 2) % 6}"})
    return rows


def test_train_router_cross_task_scores_unseen_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], embedder: Any
) -> None:
    """--cross-task writes no weights; every file is scored by a router fitted on the others and
    each file's domain groups by one fitted without them, beside the prompt-length baseline."""
    from gateway.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for name, seed in (("alpha", 1), ("beta", 2)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _cross_task_rows(60, seed)))
    args = ["train", "router", "--data", str(data), "--cross-task", "--json", "--l2", "0.001"]
    assert main([*args, "--out", str(tmp_path / "w.json")]) == 0
    assert not (tmp_path / "w.json").exists()
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    splits = {s["split"]: s for s in doc["splits"]}
    assert set(splits) == {
        "alpha (trained on the other files)", "beta (trained on the other files)",
        "alpha: held-out domains, 5 folds pooled", "beta: held-out domains, 5 folds pooled",
    }  # fmt: skip
    for s in splits.values():
        assert s["n"] == 60
        # the router generalises (its length prior costs it a little here); length alone misleads
        assert s["apgr"] > 0.7 and s["length_apgr"] < 0.5, s
    assert splits["alpha: held-out domains, 5 folds pooled"]["fold_apgr_mean"] > 0.7
