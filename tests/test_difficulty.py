"""Router v2: the difficulty model (IRT) — data reading, the fit recovering a known
difficulty, the cross-task report, the serving model, the cheapest-within-target choice,
`select: cheapest` routes, and `router score --models` / `policy simulate` on the real embedder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cli import main
from gateway.config.loader import PolicyError, load_policy
from gateway.config.policy import RoutePolicy
from gateway.core.types import Principal
from gateway.lab.irt_data import dense, read_table
from gateway.lab.irt_eval import choose_pairs, pair_rows, split_scores
from gateway.lab.irt_fit import fit_family
from gateway.routing.classifier import ClassifierError
from gateway.routing.features import FEATURE_NAMES, N_FEATURES, feature_matrix
from gateway.routing.plan import QualityRoute
from gateway.routing.quality import SHIPPED_DIFFICULTY, DifficultyModel, Prediction, choose
from gateway.routing.router import Router

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def weights_doc(w_emb: list[float] | None = None, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "switchyard-difficulty/1",
        "embedder": {"name": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384},
        "features": list(FEATURE_NAMES),
        "feature_mean": [0.0] * N_FEATURES,
        "feature_std": [1.0] * N_FEATURES,
        "emb_scale": 1.0,
        "w_emb": w_emb if w_emb is not None else [0.0] * 384,
        "w_feat": [0.0] * N_FEATURES,
        "d_mean": 0.0,
        "d_std": 1.0,
        "length_prior": 0.0,
        "abilities": {"src/known-model": 1.5},
        "ability_from_mmlu_pro": {"intercept": 0.5, "slope": 2.0},
    }
    return doc | over


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    return path


# ----------------------------------------------------------------------------- data
def test_read_table_reads_every_format(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"prompt": "p1", "category": "math", "correct": {"m1": True, "m2": False}}) + "\n"
    )
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"prompt": "p2", "task": "qa", "score": {"m1": 0.25}}) + "\n"
        + json.dumps({"prompt": "p3", "dataset": "oasst", "pref": {"m1": 1.75}, "output_chars": {"m1": 40}})
        + "\n"
        + "".join(
            json.dumps({"prompt": f"q{i}", "domain": "d", "weak_correct": i % 2, "strong_correct": True}) + "\n"
            for i in range(48)
        )
    )  # fmt: skip
    t = read_table([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert len(t.prompts) == 51 and t.task[:3] == ["a/math", "b/qa", "b/oasst"]
    y = dense(t)
    assert y[0, t.models.index("a/m1")] == 1.0 and y[0, t.models.index("a/m2")] == 0.0
    assert y[1, t.models.index("b/m1")] == 0.25 and y[2, t.models.index("b/m1")] == 0.75
    assert "b/gpt-4-1106-preview" in t.models and np.isnan(y[0, t.models.index("b/m1")])
    with pytest.raises(ValueError, match="at least 50"):
        read_table([tmp_path / "a.jsonl"])


# ----------------------------------------------------------------------------- fit
def synthetic(n: int = 400, m: int = 6, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, 384)).astype(np.float32) / np.sqrt(384)
    true_w = rng.standard_normal(384)
    d_true = (emb.astype(np.float64) @ true_w) * 8.0
    abilities = np.linspace(-1.5, 1.5, m)
    rows = np.repeat(np.arange(n), m)
    cols = np.tile(np.arange(m), n)
    p = 1 / (1 + np.exp(-(abilities[cols] - d_true[rows])))
    y = (rng.random(len(p)) < p).astype(np.float64)
    source = [f"s{i % 3}" for i in range(n)]
    return {"emb": emb, "d": d_true, "rows": rows, "cols": cols, "y": y, "source": source, "m": m}


@pytest.mark.parametrize("family", ["irt", "mirt", "ridge", "knn"])
def test_families_recover_a_known_difficulty(family: str) -> None:
    s = synthetic()
    feats = np.zeros((len(s["d"]), N_FEATURES))
    fit = fit_family(
        family, s["emb"][:300], feats[:300], s["source"][:300], s["rows"][s["rows"] < 300],
        s["cols"][s["rows"] < 300], s["y"][s["rows"] < 300], tuple(f"m{j}" for j in range(s["m"])),
    )  # fmt: skip
    held = fit.difficulty(s["emb"][300:], feats[300:])  # prompts the fit never saw
    corr = float(np.corrcoef(held, s["d"][300:])[0, 1])
    assert corr > (0.6 if family in ("irt", "mirt") else 0.3), corr
    if family == "irt":
        assert list(np.argsort(fit.abilities)) == list(range(s["m"]))  # abilities in the true order


def test_fit_is_deterministic() -> None:
    s = synthetic(n=200)
    feats = np.zeros((200, N_FEATURES))
    args = (s["emb"], feats, s["source"], s["rows"], s["cols"], s["y"], tuple(f"m{j}" for j in range(s["m"])))
    assert np.array_equal(fit_family("irt", *args).w, fit_family("irt", *args).w)


def test_cross_task_report_never_scores_a_prompt_it_fitted(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.lab.irt_eval as ev

    s = synthetic(n=240, m=4)
    seen: list[tuple[set[int], set[int]]] = []
    real = ev._fit

    def spy(fam: str, data: Any, train: Any, fits: Any) -> Any:
        seen.append((set(np.flatnonzero(train)), set()))
        return real(fam, data, train, fits)

    monkeypatch.setattr(ev, "_fit", spy)
    table = ev.Table(
        [f"prompt {i} " * (i % 7 + 1) for i in range(240)], s["source"],
        [f"{src}/t{i % 4}" for i, src in enumerate(s["source"])],
        [f"s{k}/m{j}" for k in range(3) for j in range(4)][:4], s["rows"], s["cols"], s["y"],
        np.full(len(s["y"]), np.nan),
    )  # fmt: skip
    # give each source its own models so pairs are per source
    cols = s["cols"] + 4 * np.array([int(src[1]) for src in s["source"]])[s["rows"]]
    table = ev.Table(
        table.prompts, table.source, table.task, [f"s{k}/m{j}" for k in range(3) for j in range(4)],
        s["rows"], cols, s["y"], table.out_chars,
    )  # fmt: skip
    feats = feature_matrix(table.prompts)
    splits = split_scores(table, s["emb"], feats, ("irt",), seed=0)
    loso = splits["leave-one-source-out"]["irt"]
    assert np.isfinite(loso).all()
    src = np.array(table.source)
    for train, _ in seen[:3]:  # the three leave-one-source-out fits: one source missing each
        assert len({src[i] for i in train}) == 2
    pairs = choose_pairs(table, dense(table))
    assert pairs and all(p.strong_acc - p.weak_acc >= 0.10 for p in pairs)
    rows = pair_rows(table, feats, {"irt": loso}, pairs[0], {})
    names = [r["router"] for r in rows]
    assert names == ["irt", "random", "prompt-length", "oracle", "ceiling", "ceiling+len"]
    oracle = rows[3]
    assert oracle["apgr"] >= max(r["apgr"] for r in rows)
    assert 0.3 < rows[1]["apgr"] < 0.7  # random


# ----------------------------------------------------------------------------- serving
def test_choose_cheapest_within_the_target() -> None:
    preds = [Prediction("big", 0.90, 10.0), Prediction("mid", 0.87, 2.0), Prediction("small", 0.60, 0.1)]
    assert choose(preds, 0.95).model == "mid"  # 0.87 >= 0.95 * 0.90
    assert choose(preds, 0.99).model == "big"
    assert choose(preds, 0.5).model == "small"


def test_difficulty_arithmetic_and_abilities(tmp_path: Path) -> None:
    w = [0.0] * 384
    w[0] = 2.0
    dm = DifficultyModel.load(write(tmp_path, weights_doc(w)))
    v = np.zeros(384, dtype=np.float32)
    v[0] = 0.5
    assert dm.difficulty(v, "hello") == pytest.approx(1.0)
    assert dm.difficulty_batch(np.stack([v, -v]), ["a", "b"]) == pytest.approx([1.0, -1.0])
    assert dm.success(1.0, 1.0) == pytest.approx(0.5)
    assert dm.ability("known-model") == 1.5  # fitted on the data, by name
    assert dm.ability("x", ability=0.2) == 0.2
    assert dm.ability("x", mmlu_pro=0.5) == pytest.approx(0.5)  # intercept + slope * logit(0.5)
    assert dm.ability("unknown") is None
    s = dm.scores(np.stack([v, -v]), ["a", "b"])
    assert s[0] > 0.5 > s[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "x/1"}, "not a switchyard-difficulty/1"),
        ({"features": ["log_chars"]}, "other text features"),
        ({"w_emb": [0.0] * 3}, "shapes"),
        ({"d_std": 0.0}, "positive"),
        ({"abilities": None}, "malformed"),
    ],
)
def test_bad_difficulty_files_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ClassifierError, match=message):
        DifficultyModel.load(write(tmp_path, weights_doc() | change))


def test_shipped_difficulty_weights_are_small_and_record_the_command() -> None:
    doc = json.loads(SHIPPED_DIFFICULTY.read_text())
    assert SHIPPED_DIFFICULTY.stat().st_size < 100_000
    assert doc["training"]["command"].startswith("switchyard train router --irt --data ")
    dm = DifficultyModel.load()
    assert len(dm.abilities) >= 10
    dm.check_embedder("minilm-l6-onnx-int8", 384)
    with pytest.raises(ClassifierError):
        dm.check_embedder("other", 384)


def test_one_prompt_costs_well_under_a_millisecond() -> None:
    dm = DifficultyModel.load()
    v = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    text = "What is the derivative of x^2 * sin(x)? Explain each step."
    dm.difficulty(v, text)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        dm.success(dm.difficulty(v, text), 1.0)
        times.append(time.perf_counter() - t0)
    assert float(np.median(times)) < 1e-3


# ----------------------------------------------------------------------------- policy
POLICY = """
providers:
  p: {{type: openai, base_url: "http://127.0.0.1:9/v1", api_key: sk-test}}
  q: {{type: openai, base_url: "http://127.0.0.1:9/v1"}}
models:
  small: {{provider: p, price: {{input: 0.1, output: 0.4}}, ability: -1.0}}
  mid: {{provider: p, price: {{input: 1, output: 4}}, mmlu_pro: 0.6}}
  big: {{provider: p, price: {{input: 5, output: 20}}, ability: 3.0}}
  {extra}
routes:
  auto:
    targets: [{targets}]
    classifier: {{select: cheapest, quality_target: 0.95, difficulty_weights: {weights}}}
"""


def quality_route(tmp_path: Path, targets: str = "small, mid, big", extra: str = "") -> QualityRoute:
    w = [0.0] * 384
    w[0] = 10.0
    weights = write(tmp_path, weights_doc(w))
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.format(targets=targets, weights=weights, extra=extra))
    auto = Router(load_policy(path)).plan("auto", Principal("t", None, None), "chat").auto
    assert isinstance(auto, QualityRoute)
    return auto


def test_cheapest_route_sends_easy_prompts_cheap_and_hard_ones_strong(tmp_path: Path) -> None:
    auto = quality_route(tmp_path)
    assert [c.ability for c in auto.candidates] == [-1.0, pytest.approx(0.5 + 2 * np.log(1.5)), 3.0]
    easy, hard = np.zeros(384, dtype=np.float32), np.zeros(384, dtype=np.float32)
    easy[0], hard[0] = -0.8, 0.2  # difficulty -8 and 2
    plan, model, d, preds = auto.decide(easy, "easy")
    assert model == "small" and d == pytest.approx(-8.0)
    assert [t.model for t in plan.targets] == ["small", "big", "mid"]  # then by ability
    plan, model, _, preds = auto.decide(hard, "hard")
    assert model == "big" and [t.model for t in plan.targets] == ["big", "mid", "small"]
    assert preds[2].quality > preds[1].quality > preds[0].quality


async def test_cheapest_route_choice_and_unscored_fallback(tmp_path: Path) -> None:
    auto = quality_route(tmp_path)
    easy = np.zeros(384, dtype=np.float32)
    easy[0] = -0.8
    fallback: Any = object()

    async def no_embedder() -> Any:
        raise AssertionError("the vector is given")

    choice = await auto.choose(fallback, "easy", easy, no_embedder)
    assert choice.tier == "small" and choice.score == pytest.approx(-8.0)
    assert (await auto.choose(fallback, None, None, no_embedder)).plan is fallback
    bad = await auto.choose(fallback, "x", np.zeros(3, dtype=np.float32), no_embedder)
    assert bad.tier == "unscored" and bad.plan is fallback


def test_a_candidate_without_ability_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="has no ability"):
        quality_route(tmp_path, "small, nameless", "nameless: {provider: p, price: {input: 1, output: 1}}")


def test_a_provider_without_key_is_not_a_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = "other: {provider: q, price: {input: 0.01, output: 0.01}, ability: 5.0}"
    auto = quality_route(tmp_path, "small, big, other", extra)
    assert [c.model for c in auto.candidates] == ["small", "big"]


@pytest.mark.parametrize(
    ("classifier", "message"),
    [
        ({"select": "cheapest"}, "needs 'quality_target'"),
        ({"select": "cheapest", "quality_target": 0.9, "threshold": 0.5}, "needs 'quality_target'"),
    ],
)
def test_bad_cheapest_settings(classifier: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutePolicy.model_validate({"targets": ["a", "b"], "classifier": classifier})
    with pytest.raises(ValueError, match="two targets"):
        RoutePolicy.model_validate(
            {"targets": ["a"], "classifier": {"select": "cheapest", "quality_target": 0.9}}
        )


# ----------------------------------------------------------------------------- the real embedder
@pytest.fixture(scope="module")
def embedder() -> Any:
    from gateway.cache.embedder import load_embedder

    return load_embedder("torch")


def test_router_score_models_writes_per_model_success(
    tmp_path: Path, embedder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    prompts = ["What is 2 + 2?", "Prove that there are infinitely many primes p with p = 4k + 3."]
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / "out.jsonl"
    models = "Llama-2-7b-hf,gemini-1.5-pro-002"
    args = ["router", "score", "--input", str(src), "--output", str(out), "--models", models]
    assert main([*args, "--embedder", "torch", "--workers", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(set(r) == {"score", "success"} for r in rows)
    for r in rows:
        assert r["success"]["gemini-1.5-pro-002"] > r["success"]["Llama-2-7b-hf"]
    assert main([*args[:-1], "no-such-model", "--embedder", "torch", "--workers", "1"]) == 2
    assert "no ability for model" in capsys.readouterr().err


def test_policy_simulate_shows_candidates_predictions_and_choice(
    tmp_path: Path, embedder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    auto = quality_route(tmp_path)
    assert auto  # the policy file is written
    body = json.dumps({"messages": [{"role": "user", "content": "hi there"}]})
    cmd = ["policy", "simulate", str(tmp_path / "p.yaml"), "--model", "auto", "--json"]
    assert main([*cmd, "--body", body, "--embedder", "torch"]) == 0
    got = json.loads(capsys.readouterr().out)["classifier"]
    assert got["select"] == "cheapest" and [p["model"] for p in got["predictions"]] == ["small", "mid", "big"]
    assert got["chosen"] in ("small", "mid", "big") and got["order"][0] == got["chosen"]
    assert main(cmd) == 0
    assert "give --body" in json.loads(capsys.readouterr().out)["classifier"]["note"]


@pytest.mark.skipif(
    not (DATA / "routing-multi").is_dir(), reason="needs ../shared/data/routing-multi (not in a clone)"
)
def test_shipped_difficulty_orders_mmlu_pro_models_by_accuracy() -> None:
    meta = json.loads((DATA / "routing-multi" / "models.json").read_text())["mmlu-pro"]["models"]
    dm = DifficultyModel.load()
    pairs = [(v["accuracy"], dm.ability(k)) for k, v in meta.items() if dm.ability(k) is not None]
    acc, ab = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=np.float64)
    assert len(pairs) >= 20 and float(np.corrcoef(acc, ab)[0, 1]) > 0.9


def test_cheapest_route_through_the_gateway(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `select: cheapest` route on a real gateway: the easy prompt goes to the cheap model, the
    hard one to the strong model; the ledger records the chosen model and the difficulty."""
    from load_tests.mock_upstream import MockUpstream
    from tests.gateway_harness import start_gateway

    easy = "What is the capital of France?"
    hard = (
        "Let G be a finite group of order 2p where p is an odd prime. Prove that G has a normal subgroup "
        "of order p and determine all possible isomorphism classes of G, with a full derivation."
    )
    dm = DifficultyModel.load()
    d_easy, d_hard = dm.difficulty_batch(embedder.encode([easy, hard]), [easy, hard])
    assert d_easy < d_hard
    a_small = float((d_easy + d_hard) / 2 + np.log(0.95 / 0.05))  # 95% of ~1 only below the midpoint
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "torch")
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as mock:
        gw = start_gateway(
            tmp_path,
            f"""
server: {{auth: keys}}
providers:
  mock: {{type: openai, base_url: "{mock.base_url}/v1", api_key: sk-upstream-0123456789}}
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, output: 0.60}}, ability: {a_small}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, output: 10.00}}, ability: 12.0}}
routes:
  auto:
    targets: [large, small]
    classifier: {{select: cheapest, quality_target: 0.95}}
    cache: {{mode: "off"}}
""",
        )
        try:
            r_easy = gw.post(
                "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": easy}]}
            )
            r_hard = gw.post(
                "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": hard}]}
            )
            assert r_easy.status_code == r_hard.status_code == 200
            assert r_easy.headers["x-switchyard-model"] == "small"
            assert r_hard.headers["x-switchyard-model"] == "large"
            rows = {r["request_id"]: r for r in gw.ledger_rows()}
            row = rows[r_easy.headers["x-request-id"]]
            assert row["route_decision"] == "small" and row["classifier_score"] == pytest.approx(
                d_easy, abs=1e-3
            )
            assert rows[r_hard.headers["x-request-id"]]["route_decision"] == "large"
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- further designs
def test_prompt_traits_read_format_cues_and_rarity() -> None:
    from gateway.routing.prompt_traits import N_TRAITS, TRAIT_NAMES, prompt_traits, trait_matrix

    mc = "Which gas is inert?\nA. argon\nB. oxygen\nC. chlorine\nD. fluorine\nE. none"
    t = dict(zip(TRAIT_NAMES, prompt_traits(mc), strict=True))
    assert t["log_options"] == pytest.approx(np.log1p(5)) and t["recall_cue"] == 1.0
    assert t["ends_with_question"] == 0.0 and 0.0 < t["stem_share"] < 0.5
    calc = dict(
        zip(
            TRAIT_NAMES,
            prompt_traits("Calculate the speed: 120 km in 1.5 h, then 3 kg at $x^2$?"),
            strict=True,
        )
    )
    assert calc["compute_cue"] == 1.0 and calc["log_units"] > 0 and calc["log_formula_marks"] > 0
    assert calc["log_options"] == 0.0 and calc["ends_with_question"] == 1.0
    common = dict(zip(TRAIT_NAMES, prompt_traits("what is the name of the city"), strict=True))
    rare = dict(
        zip(TRAIT_NAMES, prompt_traits("elucidate the eigenvalue perturbation of a hamiltonian"), strict=True)
    )
    assert rare["mean_log_rank"] > common["mean_log_rank"] + 1.0 and rare["oov_share"] > common["oov_share"]
    assert (
        dict(zip(TRAIT_NAMES, prompt_traits("Write a short poem about spring"), strict=True))["open_cue"]
        == 1.0
    )
    assert trait_matrix(["", mc]).shape == (2, N_TRAITS) and np.isfinite(trait_matrix([""])).all()


def test_gain_target_is_the_strong_minus_weak_outcome_and_zero_where_models_agree() -> None:
    from gateway.lab.difficulty_designs import gain_target, residual_target

    # source a: two models (weak 0.25 accuracy, strong 0.75); source b: three, all agree on prompt 4
    rows = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4])
    cols = np.array([0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 4])
    y = np.array([0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=np.float64)
    g = gain_target(rows, cols, y, 5, 5, ["a", "a", "b", "b", "b"])
    assert g[:4] == pytest.approx([0.5, 0.0, 0.0, 0.5])  # (strong - weak) / 2
    assert g[4] == pytest.approx(0.0)
    r = residual_target(rows, cols, y, 5, 5)
    assert r[1] > 0 > r[2] and r[4] == pytest.approx(0.0)


def mild_synthetic(
    n: int = 900, m: int = 8, seed: int = 1, lo: float = -1.5, hi: float = 1.5
) -> dict[str, Any]:
    """Difficulty ~ N(0, 1), abilities lo..hi: every prompt informative, unlike synthetic()."""
    rng = np.random.default_rng(seed)
    scale = np.where(np.arange(384) < 8, 5.0, 1.0)  # 8 leading directions, as real embeddings have
    emb = (rng.standard_normal((n, 384)) * scale / np.sqrt(384)).astype(np.float32)
    d = emb.astype(np.float64)[:, :8] @ rng.standard_normal(8)
    d /= d.std()
    abilities = np.linspace(lo, hi, m)
    rows, cols = np.repeat(np.arange(n), m), np.tile(np.arange(m), n)
    y = (rng.random(n * m) < 1 / (1 + np.exp(-(abilities[cols] - d[rows])))).astype(np.float64)
    return {
        "emb": emb,
        "d": d,
        "rows": rows,
        "cols": cols,
        "y": y,
        "m": m,
        "source": [f"s{i % 3}" for i in range(n)],
    }


@pytest.mark.parametrize("family", ["ridge-x", "gain", "gbt", "gbt-gain"])
def test_designs_learn_from_the_training_prompts_only(family: str) -> None:
    from gateway.lab.difficulty_designs import fit_design
    from gateway.routing.prompt_traits import N_TRAITS

    # gain: abilities 1..4, where the gain of a stronger model grows with the difficulty
    # (most prompts are easy for all; the harder, the more the strong models' edge shows)
    s = mild_synthetic() if family in ("ridge-x", "gbt") else mild_synthetic(lo=1.0, hi=4.0)
    n_fit = 700
    sel = s["rows"] < n_fit
    xfeats = np.zeros((len(s["d"]), N_FEATURES + N_TRAITS))
    fit = fit_design(
        family, s["emb"][:n_fit], xfeats[:n_fit], s["source"][:n_fit], s["rows"][sel], s["cols"][sel],
        s["y"][sel], tuple(f"s/m{j}" for j in range(s["m"])),
    )  # fmt: skip
    held = fit.difficulty(s["emb"][n_fit:], xfeats[n_fit:])
    d = s["d"][n_fit:]
    corr = float(np.corrcoef(held, d)[0, 1])
    assert corr > (0.5 if family in ("ridge-x", "gbt") else 0.2), corr  # unrelated: |corr| < 0.15


def test_lenfit_learns_the_length_weight_without_the_scored_source() -> None:
    import gateway.lab.irt_eval as ev

    # three sources where the weak model fails exactly the long prompts: length is the signal
    rng = np.random.default_rng(3)
    n = 300
    words = rng.integers(1, 60, n)
    prompts = [" ".join(["word"] * int(k)) + f" {i}" for i, k in enumerate(words)]
    source = [f"s{i % 3}" for i in range(n)]
    weak = (words < 30).astype(np.float64)
    rows = np.repeat(np.arange(n), 2)
    cols = np.tile([0, 1], n) + 2 * np.repeat([i % 3 for i in range(n)], 2)
    y = np.ravel(np.column_stack([weak, np.ones(n)]))
    y[1::2][rng.random(n) < 0.1] = 0.0  # the strong model is not perfect either
    table = ev.Table(
        prompts, source, [f"{s}/t" for s in source], [f"s{k}/{w}" for k in range(3) for w in ("weak", "strong")],
        rows, cols, y, np.full(len(y), np.nan),
    )  # fmt: skip
    emb = rng.standard_normal((n, 384)).astype(np.float32) / np.sqrt(384)  # no signal in the embedding
    feats = feature_matrix(prompts)
    dd = dense(table)
    data = ev.Data(table, emb, feats, feats, dd, choose_pairs(table, dd), 0)
    train = np.array(source) != "s0"
    fits: ev.Fits = {}
    w = ev.learn_length_weight("ridge", data, train, fits)
    assert w >= 1.0  # the grid's high end: length is what predicts the weak model's failures
    fitted_on = [np.unpackbits(np.frombuffer(key, np.uint8))[:n].astype(bool) for _, key in fits]
    assert len(fitted_on) == 2 and not any((m & ~train).any() for m in fitted_on)  # never s0's prompts
    scores = split_scores(table, emb, feats, ("ridge+lenfit",), seed=0)["leave-one-source-out"][
        "ridge+lenfit"
    ]
    pair = next(p for p in data.pairs if p.source == "s0")
    apgr = {r["router"]: r["apgr"] for r in pair_rows(table, feats, {"ridge+lenfit": scores}, pair, {})}
    assert apgr["ridge+lenfit"] > apgr["random"] + 0.2


def test_eval_multi_refuses_an_unknown_family(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["eval", "router", "--multi", str(DATA / "routing-multi"), "--families", "irt,nope+len"])
    assert rc == 2 and "unknown family 'nope+len'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the prompt-difficulty score
def test_shipped_prompt_difficulty_is_small_reproducible_and_scores_in_order() -> None:
    from gateway.routing.prompt_difficulty import SHIPPED_PROMPT_DIFFICULTY, PromptDifficulty

    doc = json.loads(SHIPPED_PROMPT_DIFFICULTY.read_text())
    assert SHIPPED_PROMPT_DIFFICULTY.stat().st_size < 50_000
    assert doc["training"]["command"].startswith("switchyard train router --prompt-difficulty --data ")
    pd = PromptDifficulty.load()
    pd.check_embedder("minilm-l6-onnx-int8", 384)
    with pytest.raises(ClassifierError):
        pd.check_embedder("other", 384)
    v = np.zeros((2, 384), dtype=np.float32)
    s = pd.scores(v, ["hi", "Given the integral of x^2 sin(x) dx from 0 to pi, " * 6])
    assert s.shape == (2,) and 0 < s[0] < s[1] < 1  # same embedding: the long one needs more
    with pytest.raises(ClassifierError, match="shape"):
        pd.scores(v, ["one"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "x/1"}, "not a switchyard-prompt-difficulty/1"),
        ({"features": ["log_chars"]}, "other text features"),
        ({"w_emb": [0.0] * 3}, "shapes"),
        ({"d_std": 0.0}, "positive"),
        ({"length_weight": None}, "malformed"),
    ],
)
def test_bad_prompt_difficulty_files_are_refused(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    from gateway.routing.prompt_difficulty import SHIPPED_PROMPT_DIFFICULTY, PromptDifficulty

    doc = json.loads(SHIPPED_PROMPT_DIFFICULTY.read_text()) | change
    with pytest.raises(ClassifierError, match=message):
        PromptDifficulty.load(write(tmp_path, doc))


def test_router_score_with_the_difficulty_scorer(tmp_path: Path, embedder: Any) -> None:
    from gateway.routing.prompt_difficulty import PromptDifficulty

    src = tmp_path / "in.jsonl"
    prompts = ["What is 2 + 2?", "Hi", "Which is larger?\nA. 3\nB. 4\nC. 5\nD. 6"]
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / "out.jsonl"
    args = [
        "router",
        "score",
        "--input",
        str(src),
        "--output",
        str(out),
        "--embedder",
        "torch",
        "--workers",
        "1",
    ]
    assert main([*args, "--scorer", "difficulty"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(set(r) == {"score"} for r in rows)
    expect = PromptDifficulty.load().scores(embedder.encode(prompts), prompts)
    assert [r["score"] for r in rows] == pytest.approx(expect.tolist(), abs=1e-5)
    assert main(args) == 0  # the default stays v1's classifier: other scores
    assert [json.loads(line)["score"] for line in out.read_text().splitlines()] != pytest.approx(
        expect.tolist()
    )
