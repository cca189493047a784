"""The semantic-cache verifier: hard rules for near-miss traps, the shipped weights, training."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.cache import verifier_text as vt
from gateway.cache.verifier import (
    FEATURES,
    INPUT_DIM,
    WEIGHTS_PATH,
    Verifier,
    analyse,
    hard_reject,
    load_verifier,
    model_input,
)
from gateway.cache.verifier_text import Text
from gateway.lab.verifier_train import (
    fit_ensemble,
    is_heldout,
    pick_threshold,
    read_pairs,
    train,
    val_fold,
)
from tests.semcache_support import embedder, qqp_rows  # noqa: F401

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
    ("What are the functions of preprocessor directives in C++?",
     "What are the functions of preprocessor directives in C?", "code"),
    ("Should I learn C# or Java first?", "Should I learn C++ or Java first?", "code"),
    ("What are the positive effects of caffeine?", "What are the negative effects of caffeine?", "antonym"),
    ("What are the advantages of remote work?", "What are the disadvantages of remote work?", "antonym"),
]  # fmt: skip


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
    assert hard_reject(analyse("Is C++ hard?"), analyse("Is c++ really hard to learn?")) is None


def test_tokens_keep_symbols_scripts_and_code_names_apart() -> None:
    """The same-words shortcut (score 1 without the model) must not ignore what the old ASCII-only
    tokenizer dropped: non-Latin words, symbols, C++/C#."""
    same = [
        ("What will be the output of the following program ?", "what will be the output of the following program"),
        ("What does “serendipity” mean?", "What does serendipity mean"),
    ]  # fmt: skip
    other = [
        ("What does 심하잖아 mean?", "What does 任せてほしい mean?"),
        ("What does ~ mean in C++?", "What does % mean in C++?"),
        ("What is the difference between () and [] in Python?",
         "What is the difference between = and == in Python?"),
        ("What is C?", "What is C#?"),
    ]  # fmt: skip
    for a, b in same:
        assert analyse(a).words == analyse(b).words, (a, b)
    for a, b in other:
        assert analyse(a).words != analyse(b).words, (a, b)
    assert analyse("What is C# used for?").code == ("c#",)


def _analyse_reference(text: str) -> Text:
    """analyse() as first written (one generator per field): the lean version must match it."""
    tokens = [t for t in vt._TOKEN.findall(text) if not set(t) <= vt._PUNCT]
    words = tuple(t.lower() for t in tokens)
    numbers = [n.replace(",", "") for n in vt._NUMBER.findall(text)]
    numbers += [vt._NUMBER_WORDS[w] for w in words if w in vt._NUMBER_WORDS]
    operators = [o.replace("×", "*").replace("÷", "/") for o in vt._OPERATOR.findall(text)]
    operators += [vt._OPERATOR_WORDS[w] for w in words if w in vt._OPERATOR_WORDS]
    negated = any(w in vt._NEGATIONS or w.endswith("n't") for w in words)
    caps = frozenset(t.lower() for t in tokens[1:] if t[:1].isupper() and t.lower() not in vt._STOP)
    qword = next((w for w in words if w in vt._QWORDS), "")
    content = frozenset(w for w in words if w not in vt._STOP and w not in vt._NEGATIONS)
    code = tuple(sorted(w for w in words if len(w) > 1 and w[0].isalnum() and w[-1] in "+#"))
    return Text(
        text, words, tuple(sorted(numbers)), tuple(sorted(operators)), negated, caps, qword, content, code
    )


def test_analysis_matches_the_reference_field_by_field() -> None:
    texts = [
        "", "?!", "-- ... ?", "C++ and C# vs C", "I can't, won't; NOT never", "\u201cquoted\u201d \u2026 \u2018x\u2019",
        "1,000,000 plus 2×3 ÷ 4 = 5", "İstanbul ǅ ß ﬁ 東京 의", "a' 'b it's O'Neil", "What is Two times TEN?",
        "Why is the best rust crate better than the worst?", "x " * 300,
    ]  # fmt: skip
    rng = np.random.default_rng(3)
    pieces = [
        "How",
        "many",
        "12",
        "3.5",
        "+",
        "-",
        "n't",
        "not",
        "?",
        "!",
        "C++",
        "Paris",
        "the",
        "'",
        "…",
        "(",
        ")",
    ]
    texts += [" ".join(rng.choice(pieces, size=n)) for n in range(1, 80)]
    texts += ["".join(rng.choice(pieces, size=n)) for n in range(1, 40)]
    for text in texts:
        assert analyse(text) == _analyse_reference(text), text


def test_shipped_weights_are_small_documented_and_loadable() -> None:
    assert WEIGHTS_PATH.stat().st_size < 2_000_000  # weights only: never the training data
    v = load_verifier()
    assert v.meta["command"].startswith("switchyard train semcache --pairs ")
    assert 0 < v.threshold < 1 and 0 < v.min_cosine < 1
    assert v.w1.shape == (INPUT_DIM, v.b1.shape[0]) and v.members >= 1
    assert 0.9 <= v.meta["oof_precision"] <= 1.0  # threshold chosen on validation folds, not held-out


def test_single_and_batch_probabilities_agree() -> None:
    v = load_verifier()
    rng = np.random.default_rng(1)
    a, b = analyse("How can I learn Python quickly?"), analyse("What is the fastest way to learn Python?")
    xs, singles = [], []
    for _ in range(5):
        u = rng.normal(size=384).astype(np.float32)
        w = rng.normal(size=384).astype(np.float32)
        u, w = u / np.linalg.norm(u), w / np.linalg.norm(w)
        xs.append(model_input(a, b, float(u @ w), u, w))
        singles.append(v.probability(a, b, float(u @ w), u, w))
    assert np.allclose(v.probabilities(np.asarray(xs)), singles, atol=1e-5)


def test_verifier_separates_paraphrase_from_entity_swap(embedder: Any) -> None:  # noqa: F811
    v = load_verifier()

    def score(a: str, b: str) -> float:
        u, w = embedder.encode([a, b])
        return v.score(analyse(a), analyse(b), u, w)

    same = score("How can I learn Python quickly?", "What is the fastest way to learn Python?")
    other = score("How can I learn Python quickly?", "How can I learn Java quickly?")
    assert same > other
    assert score("What is 17 * 23?", "What is 17 * 23?") > v.threshold  # identical: a hit
    assert score("What does 심하잖아 mean?", "What does 任せてほしい mean?") < 1.0


def test_score_cost_is_small(embedder: Any) -> None:  # noqa: F811
    v = load_verifier()
    a, b = "How do I improve my English speaking skills?", "How can I improve my spoken English?"
    u, w = embedder.encode([a, b])
    ta, tb = analyse(a), analyse(b)
    v.score(ta, tb, u, w)
    t0 = time.perf_counter()
    for _ in range(200):
        v.score(ta, tb, u, w)
    assert (time.perf_counter() - t0) / 200 < 0.002  # ~0.1 ms on a quiet core; loose for shared CI


def test_weights_for_other_features_are_refused(tmp_path: Path) -> None:
    v = load_verifier()
    path = tmp_path / "w.npz"
    v.save(path)
    assert load_verifier(path).threshold == v.threshold
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(str(arrays["header"]))
    header["features"] = list(FEATURES)[:-1]
    arrays["header"] = np.array(json.dumps(header))
    np.savez(path, **arrays)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retrain"):
        load_verifier(path)


def test_split_is_deterministic_and_about_one_fifth() -> None:
    pairs = [(f"question {i}", f"other question {i}") for i in range(5000)]
    held = [is_heldout(a, b) for a, b in pairs]
    assert held == [is_heldout(a, b) for a, b in pairs]
    assert 0.17 < sum(held) / len(held) < 0.23
    folds = [val_fold(a, b) for a, b in pairs]
    assert set(folds) == {0, 1, 2, 3, 4} and max(folds.count(k) for k in range(5)) < 1150


def test_read_pairs_reports_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"text_a": "a", "text_b": "b", "label": 1}\n{"text_a": "a"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: need text_a, text_b, label"):
        read_pairs(path)


def test_ensemble_fit_folds_standardisation_into_weights_and_threshold_pick() -> None:
    from sklearn.neural_network import MLPClassifier

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, INPUT_DIM))
    x[:, 0] = x[:, 0] * 50 + 1000  # a raw feature far from standardised: folding must handle it
    x[:, 2] = 7.0  # a constant one
    y = ((x[:, 0] - 1000) / 50 - x[:, 1] + rng.normal(scale=0.3, size=3000) > 0).astype(float)
    w1, b1, w2, b2 = fit_ensemble(x[:2000], y[:2000], members=1, hidden=8, alpha=30.0, seed=5)
    v = Verifier(w1, b1, w2, b2, 0.5, 0.7)
    p = v.probabilities(x[2000:].astype(np.float32))
    # the folded weights on raw inputs == scikit-learn's model on standardised inputs
    mean, scale = x[:2000].mean(axis=0), x[:2000].std(axis=0)
    scale[scale < 1e-9] = 1.0
    ref = MLPClassifier((8,), alpha=30.0, max_iter=200, early_stopping=True, random_state=5)
    ref.fit((x[:2000] - mean) / scale, y[:2000])
    assert np.allclose(p, ref.predict_proba((x[2000:] - mean) / scale)[:, 1], atol=1e-4)
    t = pick_threshold(p, y[2000:], 0.95)
    hits = p >= t
    assert y[2000:][hits].mean() >= 0.95 and 50 <= hits.sum() < 1000


def test_train_on_a_slice_of_qqp(tmp_path: Path, embedder: Any) -> None:  # noqa: F811
    rows = qqp_rows(1500)
    if not rows:
        pytest.skip("../shared/data/semcache/qqp-dev.jsonl is not there")
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    v, meta = train(path, embedder, members=1, target_precision=0.9)
    assert meta["train_pairs"] == len(read_pairs(path, "train")) and meta["candidates"] > 200
    assert 0 < v.threshold <= 1 and v.members == 1
    v.save(tmp_path / "w.npz")
    again = load_verifier(tmp_path / "w.npz")
    a, b = analyse("How do I learn to cook?"), analyse("How can I learn cooking?")
    u, w = embedder.encode([a.raw, b.raw])
    assert again.score(a, b, u, w) == pytest.approx(v.score(a, b, u, w))
