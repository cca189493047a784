"""Per-entry online thresholds: an entry lowers its threshold only on its own confirmed record,
a refutation raises it, and the error of what it then serves stays bounded."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway.cache.online_threshold import EntryRecord, OnlinePolicy
from tests.semcache_support import embedder  # noqa: F401

POLICY = OnlinePolicy(
    start=0.95, floor=0.6, max_error=0.05, prior_table=((0.0, 0.7),), prior_weight=4.0, min_ok=3
)


def test_a_fresh_entry_keeps_the_global_threshold() -> None:
    rec = EntryRecord(POLICY.start)
    assert POLICY.level([]) == POLICY.start
    for _ in range(POLICY.min_ok - 1):  # too few confirmations of its own
        rec.observe(POLICY, 0.9, True)
    assert rec.threshold == POLICY.start


def test_confirmations_lower_it_to_the_lowest_confirmed_level_never_below_the_floor() -> None:
    rec = EntryRecord(POLICY.start)
    for score in (0.93, 0.92, 0.91, 0.9, 0.89) * 4 + (0.4, 0.3):
        rec.observe(POLICY, score, True)
    # prior error 4 * 0.3 = 1.2 pseudo-errors: (1.2 + 0) / (4 + ok) <= 0.05 needs ok >= 20
    assert rec.threshold == 0.89
    assert rec.threshold >= POLICY.floor
    assert POLICY.level([(0.9, True)] * 19) == POLICY.start
    assert POLICY.level([(0.9, True)] * 20) == 0.9


def test_a_better_prior_near_the_start_needs_fewer_confirmations() -> None:
    policy = OnlinePolicy(start=0.95, floor=0.6, prior_table=((0.6, 0.7), (0.9, 0.98)))
    # at 0.92 the band [0.92, 0.95) is 98% right globally: (4 * 0.02) / (4 + 3) <= 0.05
    assert policy.level([(0.92, True)] * 3) == 0.92
    assert policy.level([(0.8, True)] * 3) == policy.start  # at 0.8 the prior is 0.7: not yet
    assert policy.level([(0.5, True)] * 50) == policy.start  # below the floor: never
    by_score = OnlinePolicy(start=0.95, floor=0.6)  # no table: the score is the prior
    assert by_score.prior_at(0.93) == 0.93
    assert by_score.level([(0.93, True)] * 3) == 0.93  # (4 * 0.07) / 7 = 0.04
    assert by_score.level([(0.8, True)] * 3) == by_score.start  # (4 * 0.2) / 7 = 0.11
    assert by_score.level([(0.8, True)] * 12) == 0.8  # (4 * 0.2) / 16 = 0.05


def test_a_refutation_raises_it_above_the_refuted_score() -> None:
    rec = EntryRecord(POLICY.start)
    for _ in range(25):
        rec.observe(POLICY, 0.9, True)
    assert rec.threshold == 0.9
    rec.observe(POLICY, 0.91, False)
    assert rec.threshold > 0.91  # the refuted level (and everything below) is closed again
    refuted_hit = EntryRecord(POLICY.start)
    refuted_hit.observe(POLICY, 0.97, False)  # a hit above the global threshold was wrong
    assert refuted_hit.threshold > 0.97


def test_scores_below_the_floor_are_ignored() -> None:
    rec = EntryRecord(POLICY.start)
    for _ in range(50):
        rec.observe(POLICY, 0.3, True)
    assert rec.threshold == POLICY.start and not rec.record


def _serve(
    policy: OnlinePolicy, error: float, queries: int, rng: random.Random, judge: float
) -> tuple[int, int]:
    """One entry whose band answers are wrong with probability ``error``: band misses are
    judged (the judge is sound: it confirms a right one with probability ``judge``, anything
    else counts as refuted), 10% of band hits are shadow-checked the same way. Returns (band
    hits served, wrong ones among them)."""
    rec = EntryRecord(policy.start)
    served = wrong = 0
    for _ in range(queries):
        score = rng.uniform(policy.floor, policy.start)
        right = rng.random() >= error
        if score >= rec.threshold:
            served += 1
            wrong += not right
            if rng.random() < 0.1:
                rec.observe(policy, score, right and rng.random() < judge)
        else:
            rec.observe(policy, score, right and rng.random() < judge)
    return served, wrong


@pytest.mark.parametrize("judge", [1.0, 0.7])
@pytest.mark.parametrize("error", [0.0, 0.01, 0.03, 0.1, 0.3, 0.6, 1.0])
def test_what_an_entry_serves_below_the_start_has_bounded_error(error: float, judge: float) -> None:
    rng = random.Random(7)
    entries, served, wrong = 200, 0, 0
    for _ in range(entries):  # 60 band queries each
        s, w = _serve(POLICY, error, 60, rng, judge)
        served, wrong = served + s, wrong + w
    if error <= POLICY.max_error and served >= 100:
        assert wrong / served <= POLICY.max_error + 0.01, (served, wrong)
    # a worse entry is caught: far fewer wrong answers than the 1 / shadow-rate (10) per entry
    # that an entry lowered once and checked only by sampling could serve
    assert wrong / entries <= 1.0, (served, wrong)
    if error == 0.0 and judge == 1.0:
        assert served > 0.3 * entries * 60  # a good entry does get its band back
    if error >= 0.3:
        assert served < 0.01 * entries * 60  # a bad one almost never serves below the start


def test_a_realistic_mix_of_entries_stays_under_the_error_bound() -> None:
    rng = random.Random(11)
    served = wrong = 0
    for error in [0.0] * 120 + [0.02] * 40 + [0.1] * 20 + [0.5] * 20:
        s, w = _serve(POLICY, error, 60, rng, 1.0)
        served, wrong = served + s, wrong + w
    assert served > 0.2 * 200 * 60
    assert wrong / served <= POLICY.max_error, (served, wrong)


# ------------------------------------------------------------- the real cache, embedder and faiss
def _completion(text: str) -> bytes:
    msg = {"role": "assistant", "content": text}
    return json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": msg}]}).encode()


@pytest.fixture
def cache() -> Any:
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.verifier import load_verifier

    verifier = load_verifier()
    policy = OnlinePolicy(start=verifier.threshold, floor=0.3, prior_table=((0.0, 0.99),), min_ok=3)
    c = SemanticCache(verifier, online=policy)
    yield c
    c.close()


def test_an_entry_confirmed_in_the_band_answers_there_and_traps_still_never_hit(
    cache: Any,
    embedder: Any,  # noqa: F811
) -> None:
    cached, asked = "How do I learn to play the guitar?", "What is the best way to learn guitar?"
    va, vb = embedder.encode([cached, asked])
    uid = cache.insert("ctx", cached, va, _completion("practice"), ttl=60)
    first = cache.lookup("ctx", asked, vb)
    assert not first.hit and first.uid == uid and 0.3 <= first.score < first.cut  # in the band
    for _ in range(3):
        assert cache.observe(uid, first.score, True)
    assert cache.entry_threshold(uid) == pytest.approx(first.score)
    again = cache.lookup("ctx", asked, vb)
    assert again.hit and again.matched == cached and again.payload == _completion("practice")
    assert not cache.lookup("other", asked, vb).hit  # still scoped to its context
    # a number-changed trap is refused by the hard rules whatever the entry learned
    trap_cached, trap_asked = "What is 17 * 23?", "What is 17 * 24?"
    ta, tb = embedder.encode([trap_cached, trap_asked])
    trap = cache.insert("ctx", trap_cached, ta, _completion("391"), ttl=60)
    for _ in range(10):
        cache.observe(trap, 0.31, True)
    found = cache.lookup("ctx", trap_asked, tb)
    assert not found.hit and found.reject == "numbers"


def test_a_refuted_band_candidate_stays_a_miss(cache: Any, embedder: Any) -> None:  # noqa: F811
    cached, asked = "How do I learn to play the guitar?", "What is the best way to learn guitar?"
    va, vb = embedder.encode([cached, asked])
    uid = cache.insert("ctx", cached, va, _completion("practice"), ttl=60)
    score = cache.lookup("ctx", asked, vb).score
    for ok in (True, True, False, True):
        cache.observe(uid, score, ok)
    assert cache.entry_threshold(uid) == cache.online.start
    assert not cache.lookup("ctx", asked, vb).hit


def test_aliases_reach_their_entry_and_go_with_it(cache: Any, embedder: Any) -> None:  # noqa: F811
    cached, alias = "How do I learn to play the guitar?", "What is the best way to learn guitar?"
    va, vb = embedder.encode([cached, alias])
    uid = cache.insert("ctx", cached, va, _completion("practice"), ttl=60)
    assert cache.add_alias(uid, alias, vb)
    assert not cache.add_alias(uid, alias, vb)  # once
    found = cache.lookup("ctx", "what is the best way to learn guitar", vb)  # the alias' words
    assert found.hit and found.score == 1.0 and found.matched == cached and found.uid == uid
    # an alias never lets a query past the hard rules of the entry's own text
    vc = embedder.encode(["What is the best way to learn guitar in 3 months?"])[0]
    assert not cache.lookup("ctx", "What is the best way to learn guitar in 3 months?", vc).hit
    cache._drop(cache._by_uid[uid])
    assert len(cache) == 0 and cache.partitions == 0 and not cache._aliases


def test_the_layer_turns_a_fresh_answer_into_feedback(embedder: Any) -> None:  # noqa: F811
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_key import SemanticKey
    from gateway.cache.semantic_layer import SemanticLayer, SemanticResult
    from gateway.cache.verifier import load_verifier
    from gateway.flow.services import TaskOwner

    verifier = load_verifier()
    layer = SemanticLayer(spawn=TaskOwner().spawn)
    cache = SemanticCache(verifier, online=OnlinePolicy(start=verifier.threshold, floor=0.3, min_ok=1))
    layer._cache = cache
    cached, asked = "How do I learn to play the guitar?", "What is the best way to learn guitar?"
    va, vb = embedder.encode([cached, asked])
    uid = cache.insert("ctx", cached, va, _completion("Practice daily."), ttl=60)

    def result(text: str, vec: Any) -> Any:
        return SemanticResult(SemanticKey("ctx", text), vec, cache.lookup("ctx", text, vec), 0.0)

    miss = result(asked, vb)
    assert not miss.lookup.hit and miss.lookup.uid == uid
    layer.store(miss, _completion("practice   DAILY."), ttl=60)  # the same answer: confirmed
    assert len(cache) == 1 and len(cache._aliases) == 1
    assert cache.entry(uid).online.confirmed == 1
    other = "Which guitar should a beginner buy?"
    vo = embedder.encode([other])[0]
    res = result(other, vo)
    if res.lookup.uid == uid and not res.lookup.hit and res.lookup.score >= 0.3:
        layer.store(res, _completion("A cheap acoustic one."), ttl=60)  # another answer: refuted
        assert cache.entry(uid).online.refuted == 1
    else:
        layer.store(res, _completion("A cheap acoustic one."), ttl=60)
    assert len(cache) == 2  # a different answer is stored as its own entry
    cache.close()


GUITAR = [
    "How do I learn to play the guitar?",
    "What is the best way to learn guitar?",
    "How can I learn to play guitar by myself?",
    "How can I teach myself guitar?",
    "What's the best way to teach yourself to play the guitar?",
    "How should a beginner learn the guitar?",
]
TRAPS = [
    ("What is 17 * 23?", "What is 17 * 24?"),
    ("How do I convert 5 km to miles?", "How do I convert 50 km to miles?"),
]


def _fixture_pairs() -> list[tuple[str, str, int]]:
    pairs = [(GUITAR[0], q, 1) for q in GUITAR[1:]] + [(GUITAR[1], GUITAR[3], 1)]
    pairs += [(a, b, 0) for a, b in TRAPS] + [(GUITAR[0], "How do I tune a guitar?", 0)]
    return pairs


def test_streams_through_the_real_cache_online_modes_add_hits_never_traps(embedder: Any) -> None:  # noqa: F811
    from gateway.cache.verifier import load_verifier
    from gateway.lab.semcache_stream import components, embed_texts, stream_table

    pairs = _fixture_pairs()
    assert sorted(len(c) for c in components(pairs)) == [2, 2, 7]
    vectors = embed_texts(embedder, pairs)
    verifier = load_verifier()
    # a trusting prior (one confirmation lowers an entry to the confirmed score) on a tiny fixture
    policy = OnlinePolicy(start=verifier.threshold, floor=0.5, prior_table=((0.0, 0.99),), min_ok=1)
    rows: dict[tuple[str, float | None], dict[str, int]] = {}
    for seed in range(4):  # a few stream orders
        for r in stream_table(pairs, vectors, verifier, min_component=2, seed=seed, online=policy):
            acc = rows.setdefault((r["mode"], r["judge_recall"]), {"right": 0, "wrong": 0, "answerable": 0})
            for k in acc:
                acc[k] += r[k]
    static = rows[("static", None)]
    assert static["answerable"] == 4 * 5  # every guitar question after the first
    assert static["right"] == 0  # these paraphrases all score below the shipped threshold
    assert rows[("online", 1.0)]["right"] >= 6  # confirmed entries answer their band
    assert rows[("online+aliases", 1.0)]["right"] >= rows[("online", 1.0)]["right"]
    for acc in rows.values():
        assert acc["wrong"] == 0  # neither a trap nor the tuning question is ever served
