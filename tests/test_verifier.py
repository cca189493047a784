"""The semantic-cache verifier: hard rules for near-miss traps, the shipped weights, training."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gateway.cache.verifier import (
    FEATURES,
    WEIGHTS_PATH,
    analyse,
    hard_reject,
    load_verifier,
    verifier_from_json,
)
from gateway.cache.verifier_train import fit_logistic, is_heldout, pick_threshold, read_pairs
from tests.semcache_support import embedder  # noqa: F401

TRAPS = [
    ("What is 17 * 23?", "What is 17 * 24?", "numbers"),
    ("What is 17 * 23?", "What is 17 + 23?", "operators"),
    ("What is 17 times 23?", "What is 17 plus 23?", "operators"),
    ("What is seventeen times 23?", "What is 18 times 23?", "numbers"),
    ("Convert 1,000 USD to EUR", "Convert 10,000 USD to EUR", "numbers"),
    ("Is Python 3.11 faster than 3.10?", "Is Python 3.12 faster than 3.10?", "numbers"),
    ("Should I take ibuprofen with alcohol?", "Should I not take ibuprofen with alcohol?", "negation"),
    ("Why does my code work?", "Why doesn't my code work?", "negation"),
    ("How do I lose weight?", "How do I lose weight without dieting?", "negation"),
]


@pytest.mark.parametrize(("a", "b", "reason"), TRAPS)
def test_hard_rules_reject_near_misses(a: str, b: str, reason: str) -> None:
    assert hard_reject(analyse(a), analyse(b)) == reason
    verifier = load_verifier()
    # whatever the vectors (here: identical), a hard reject scores 0 and can never be a hit
    u = np.full(384, 384**-0.5, dtype=np.float32)
    assert verifier.score(analyse(a), analyse(b), u, u) == 0.0


def test_same_numbers_in_other_words_pass_the_rules() -> None:
    assert hard_reject(analyse("What is 17 * 23?"), analyse("Compute 17 * 23")) is None
    assert hard_reject(analyse("Convert 1,000 USD"), analyse("convert 1000 usd")) is None
    assert hard_reject(analyse("Why can't I sleep?"), analyse("Why am I not able to sleep?")) is None


def test_shipped_weights_are_small_documented_and_loadable() -> None:
    raw = WEIGHTS_PATH.read_text()
    assert len(raw) < 32_768  # weights only (~800 numbers): never the training data
    data = json.loads(raw)
    assert data["features"] == list(FEATURES)
    assert data["meta"]["command"].startswith("switchyard train semcache --pairs ")
    v = load_verifier()
    assert 0 < v.threshold < 1 and 0 < v.min_cosine < 1
    assert v.emb_weights.shape == (768,)


def test_verifier_separates_paraphrase_from_entity_swap(embedder: Any) -> None:  # noqa: F811
    v = load_verifier()

    def score(a: str, b: str) -> float:
        u, w = embedder.encode([a, b])
        return v.score(analyse(a), analyse(b), u, w)

    same = score("How can I learn Python quickly?", "What is the fastest way to learn Python?")
    other = score("How can I learn Python quickly?", "How can I learn Java quickly?")
    assert same > other
    assert score("What is 17 * 23?", "What is 17 * 23?") > v.threshold  # identical: a hit


def test_weights_for_other_features_are_refused() -> None:
    data = json.loads(WEIGHTS_PATH.read_text())
    data["features"] = data["features"][:-1]
    with pytest.raises(ValueError, match="retrain"):
        verifier_from_json(data)


def test_split_is_deterministic_and_about_one_fifth() -> None:
    pairs = [(f"question {i}", f"other question {i}") for i in range(5000)]
    held = [is_heldout(a, b) for a, b in pairs]
    assert held == [is_heldout(a, b) for a, b in pairs]
    assert 0.17 < sum(held) / len(held) < 0.23


def test_read_pairs_reports_bad_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text_a": "a", "text_b": "b", "label": 1}\n{"text_a": "a"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: need text_a, text_b, label"):
        read_pairs(path)


def test_logistic_fit_and_threshold_pick() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3))
    y = (x @ np.array([2.0, -1.0, 0.0]) + rng.normal(scale=0.5, size=2000) > 0).astype(float)
    w, _ = fit_logistic(x, y, l2=1.0)
    assert w[0] > 1.0 and w[1] < -0.5 and abs(w[2]) < 0.3
    scores = 1 / (1 + np.exp(-(x @ w)))
    t = pick_threshold(scores, y, 0.95)
    hits = scores >= t
    assert y[hits].mean() >= 0.94 and hits.sum() > 100
