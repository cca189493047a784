"""A routed request through a real gateway and the mock upstream: the classifier's score picks
the cheap or the strong tier, and the ledger row carries the score and the decision. Also the
`switchyard router score` contract (one {"score": float} per input row, in order)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cli import main
from gateway.routing.classifier import ComplexityClassifier
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import start_gateway

EASY = "What is the capital of France?"
HARD = (
    "Let G be a finite group of order 2p where p is an odd prime. Prove that G has a normal subgroup "
    "of order p and determine all possible isomorphism classes of G, with a full derivation."
)


@pytest.fixture(scope="module")
def embedder() -> Any:
    from gateway.cache.embedder import load_embedder

    return load_embedder("torch")


def policy(mock_url: str, threshold: float) -> str:
    return f"""
server: {{auth: keys}}
providers:
  mock: {{type: openai, base_url: "{mock_url}/v1", api_key: sk-upstream-0123456789}}
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, output: 0.60}}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, output: 10.00}}}}
routes:
  auto:
    tiers: {{cheap: [small], strong: [large]}}
    classifier: {{threshold: {threshold}}}
    baseline: large
    cache: {{mode: "off"}}
  plain:
    targets: [small]
"""


@pytest.fixture
def scores(embedder: Any) -> tuple[float, float]:
    clf = ComplexityClassifier.load()
    easy, hard = clf.score_batch(embedder.encode([EASY, HARD]), [EASY, HARD])
    assert easy < hard, "the shipped classifier must rank the proof above the capital of France"
    return float(easy), float(hard)


@pytest.fixture
def mock() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as m:
        yield m


def ask(gw: Any, text: str, model: str = "auto", stream: bool = False) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}
    return gw.post("/v1/chat/completions", body)


def test_score_picks_the_tier_and_the_ledger_records_it(
    tmp_path: Path, mock: MockUpstream, scores: tuple[float, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "torch")  # the same vectors as the fixture's
    easy, hard = scores
    gw = start_gateway(tmp_path, policy(mock.base_url, round((easy + hard) / 2, 6)))
    try:
        r_easy, r_hard = ask(gw, EASY), ask(gw, HARD)
        r_stream = ask(gw, HARD, stream=True)
        r_plain = ask(gw, HARD, model="plain")
        assert r_easy.status_code == r_hard.status_code == r_stream.status_code == 200
        assert r_easy.headers["x-switchyard-model"] == "small"
        assert r_hard.headers["x-switchyard-model"] == "large"
        assert r_stream.headers["x-switchyard-model"] == "large" and "[DONE]" in r_stream.text
        assert [q["body"]["model"] for q in mock.requests()] == [
            "mock-small",
            "mock-large",
            "mock-large",
            "mock-small",
        ]
        rows = {r["request_id"]: r for r in gw.ledger_rows()}
        row_easy = rows[r_easy.headers["x-request-id"]]
        row_hard = rows[r_hard.headers["x-request-id"]]
        row_plain = rows[r_plain.headers["x-request-id"]]
        assert row_easy["route_decision"] == "cheap" and row_easy["served_model"] == "small"
        assert row_hard["route_decision"] == "strong" and row_hard["served_model"] == "large"
        assert row_easy["classifier_score"] == pytest.approx(easy, abs=1e-3)
        assert row_hard["classifier_score"] == pytest.approx(hard, abs=1e-3)
        assert row_plain["classifier_score"] is None and row_plain["route_decision"] is None
        no_user = gw.post(
            "/v1/chat/completions", {"model": "auto", "messages": [{"role": "system", "content": "hi"}]}
        )
        assert no_user.status_code == 200 and no_user.headers["x-switchyard-model"] == "small"  # tier order
        row = {r["request_id"]: r for r in gw.ledger_rows()}[no_user.headers["x-request-id"]]
        assert row["route_decision"] == "unscored" and row["classifier_score"] is None
        metrics = gw.get("/metrics").text
        assert 'switchyard_route_decisions_total{decision="strong",route="auto"} 2.0' in metrics
        assert 'switchyard_route_decisions_total{decision="cheap",route="auto"} 1.0' in metrics
    finally:
        gw.stop()


def test_strong_tier_down_falls_back_to_cheap(
    tmp_path: Path, mock: MockUpstream, scores: tuple[float, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "torch")
    gw = start_gateway(tmp_path, policy(mock.base_url, 0.0))  # everything scores >= 0: strong first
    try:
        mock.add_fault(kind="status", status=500, model="mock-large", times=10)
        r = ask(gw, EASY)
        assert r.status_code == 200 and r.headers["x-switchyard-model"] == "small"
        row = gw.ledger_rows()[-1]
        assert row["route_decision"] == "strong" and row["served_model"] == "small"
    finally:
        gw.stop()


def test_a_classifier_route_loads_the_embedder_at_start_up_not_on_the_first_request(
    tmp_path: Path, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "torch")
    gw = start_gateway(tmp_path, policy(mock.base_url, 0.5))
    try:
        semantic = gw.app_state.services.semantic
        deadline = time.monotonic() + 120
        while semantic._embedder is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert semantic._embedder is not None  # warmed in the background, no request sent
        assert not mock.requests()
    finally:
        gw.stop()


def test_an_auto_request_with_the_semantic_cache_is_embedded_once(
    tmp_path: Path, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Classifier and semantic cache on one route: each new prompt reaches the model once (the
    lookup's vector is the classifier's), and no second embed() call even asks the LRU."""
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "torch")
    route = policy(mock.base_url, 0.5).replace(
        'cache: {mode: "off"}', "cache: {mode: deterministic}\n    semantic_cache: {enabled: true}"
    )
    assert "semantic_cache" in route
    gw = start_gateway(tmp_path, route)
    try:
        prompts = [f"How many apples are left if I eat {n} of {n + 7}?" for n in range(5)]
        for text in prompts:
            body = {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}
            r = gw.post("/v1/chat/completions", body)
            assert r.status_code == 200 and r.headers["x-switchyard-cache"] == "miss"
        emb = gw.app_state.services.semantic._embedder
        assert emb.batched_texts == len(prompts)  # texts the model encoded
        assert (emb.cache.misses, emb.cache.hits) == (len(prompts), 0)  # one embed() each
        rows = gw.ledger_rows()
        assert len(rows) == len(prompts) and all(r["classifier_score"] is not None for r in rows)
    finally:
        gw.stop()


# ----------------------------------------------------------------------------- router score
def test_router_score_contract(tmp_path: Path, embedder: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = [EASY, HARD, "", "Write a haiku about rain.", "x" * 5000, "Combien font 7 fois 8 ?"]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(prompts)))
    assert main(["router", "score", "--input", str(src), "--output", str(dst), "--embedder", "torch"]) == 0
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert len(rows) == len(prompts) and all(set(r) == {"score"} for r in rows)
    got = np.array([r["score"] for r in rows])
    want = ComplexityClassifier.load().score_batch(embedder.encode(prompts), prompts)
    assert got == pytest.approx(want, abs=1e-4)  # same order as the input
    assert "prompts/s" in capsys.readouterr().err


def test_router_score_rejects_rows_without_prompt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    assert main(["router", "score", "--input", str(src), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "in.jsonl:2" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
