"""The semantic cache with the real embedder and real faiss: scoping, traps, TTL, eviction."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import gateway.cache.semantic as semantic_module
from gateway.cache.semantic import SemanticCache, pack, unpack
from gateway.cache.semantic_key import last_user_text, semantic_key
from gateway.cache.verifier import analyse, hard_reject, load_verifier, rule_key
from tests.semcache_support import embedder  # noqa: F401


def chat(
    text: str, system: str | None = None, history: list[dict[str, Any]] | None = None, **kw: Any
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += history or []
    messages.append({"role": "user", "content": text})
    return {"model": "auto", "messages": messages, "temperature": 0, **kw}


class Harness:
    """Inserts/looks up chat bodies exactly as the pipeline does (semantic_key + embedder + cache)."""

    def __init__(self, emb: Any, **kw: Any) -> None:
        self.emb = emb
        self.cache = SemanticCache(load_verifier(), **kw)

    def put(
        self, body: dict[str, Any], answer: str, tenant: str = "t1", route: str = "auto", ttl: float = 60
    ) -> None:
        key = semantic_key(tenant, route, body)
        assert key is not None
        self.cache.insert(key.context, key.text, self.emb.encode([key.text])[0], answer.encode(), ttl)

    def get(
        self, body: dict[str, Any], tenant: str = "t1", route: str = "auto", threshold: float | None = None
    ) -> Any:
        key = semantic_key(tenant, route, body)
        assert key is not None
        return self.cache.lookup(key.context, key.text, self.emb.encode([key.text])[0], threshold)


@pytest.fixture
def h(embedder: Any) -> Any:  # noqa: F811
    harness = Harness(embedder)
    yield harness
    harness.cache.close()


def test_paraphrase_hits_and_replays_the_payload(h: Harness) -> None:
    h.put(chat("How can I reset my password?"), '{"answer": "reset"}')
    # an explicit threshold: the shipped default is tuned for precision and sits close to this pair
    found = h.get(chat("How do I reset my password?"), threshold=0.9)
    assert found.hit and found.payload == b'{"answer": "reset"}'
    assert found.matched == "How can I reset my password?"
    assert 0 < found.score <= 1 and found.cosine > 0.9
    assert not h.get(chat("What is the capital of Australia?")).hit


def test_tenants_never_share_entries(h: Harness) -> None:
    h.put(chat("How can I reset my password?"), "secret answer of t1", tenant="t1")
    assert h.get(chat("How can I reset my password?"), tenant="t1").hit
    miss = h.get(chat("How can I reset my password?"), tenant="t2", threshold=0.0001)
    assert not miss.hit and miss.payload is None
    assert not h.get(chat("How can I reset my password?"), tenant="t1", route="other").hit


@pytest.mark.parametrize(
    "other",
    [
        chat("What does it mean?", system="You are a lawyer."),
        chat(
            "What does it mean?",
            history=[
                {"role": "user", "content": "Define 'estoppel'"},
                {"role": "assistant", "content": "A legal principle."},
            ],
        ),
        chat(
            "What does it mean?",
            tools=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
        ),
        chat("What does it mean?", response_format={"type": "json_object"}),
        chat("What does it mean?", temperature=0.0, seed=7),
        chat("What does it mean?", max_tokens=5),
    ],
)
def test_same_question_in_another_context_misses(h: Harness, other: dict[str, Any]) -> None:
    base = chat(
        "What does it mean?",
        history=[
            {"role": "user", "content": "Define 'entropy'"},
            {"role": "assistant", "content": "A measure of disorder."},
        ],
    )
    h.put(base, "about entropy")
    assert h.get(base).hit
    assert not h.get(other, threshold=0.0001).hit


def test_transport_fields_do_not_split_the_context(h: Harness) -> None:
    h.put(chat("How can I reset my password?"), "reset")
    assert h.get(chat("How can I reset my password?", stream=True, user="u-17")).hit


@pytest.mark.parametrize(
    ("cached", "asked"),
    [
        ("What is 17 * 23?", "What is 17 * 24?"),
        ("What is 17 * 23?", "What is 17 + 23?"),
        ("How many calories are in 100 g of rice?", "How many calories are in 200 g of rice?"),
        ("Is it safe to drink alcohol with ibuprofen?", "Is it not safe to drink alcohol with ibuprofen?"),
        ("Why does my Python script work?", "Why doesn't my Python script work?"),
    ],
)
def test_near_miss_traps_never_hit(h: Harness, cached: str, asked: str) -> None:
    h.put(chat(cached), "answer to " + cached)
    found = h.get(chat(asked), threshold=0.0001)  # even at the loosest threshold
    assert not found.hit and found.payload is None
    assert found.reject in ("numbers", "operators", "negation")
    assert h.get(chat(cached)).hit  # the entry itself is fine


def test_expired_entries_are_dropped_on_insert(h: Harness) -> None:
    for q in ("How do I boil an egg?", "Who wrote Hamlet?"):
        h.put(chat(q), q, ttl=0.2)
    time.sleep(0.3)
    h.put(chat("How do airplanes fly?"), "lift")
    assert len(h.cache) == 1 and h.cache.partitions == 1


def test_ttl_expiry(h: Harness) -> None:
    h.put(chat("How can I reset my password?"), "reset", ttl=0.3)
    assert h.get(chat("How can I reset my password?")).hit
    time.sleep(0.4)
    assert not h.get(chat("How can I reset my password?")).hit
    assert len(h.cache) == 0 and h.cache.partitions == 0


def test_size_bound_evicts_oldest_first(embedder: Any) -> None:  # noqa: F811
    h = Harness(embedder, max_entries=3)
    try:
        questions = ["How do I boil an egg?", "What is the tallest mountain?", "How do airplanes fly?",
                     "Who wrote Hamlet?"]  # fmt: skip
        for q in questions:
            h.put(chat(q), q)
        assert len(h.cache) == 3 and h.cache.evictions == 1
        assert not h.get(chat(questions[0])).hit
        assert all(h.get(chat(q)).hit for q in questions[1:])
    finally:
        h.cache.close()


def test_partition_upgrades_to_ivf_and_keeps_finding_entries() -> None:
    rng = np.random.default_rng(1)
    vecs = rng.normal(size=(1200, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    cache = SemanticCache(load_verifier(), ivf_at=1000, max_entries=5000)
    try:
        for i, v in enumerate(vecs[:1100]):
            cache.insert("ctx", f"question about topic {i}", v, b"a%d" % i, 60)
        cache.wait_idle()
        for i, v in enumerate(vecs[1100:]):  # added after the upgrade (or during it)
            cache.insert("ctx", f"question about topic {1100 + i}", v, b"a%d" % (1100 + i), 60)
        part = cache.partition("ctx")
        assert part is not None
        cache.wait_idle()
        assert part.kind == "ivf" and part.ntotal == 1200
        for i in (3, 500, 1099, 1150, 1199):
            found = cache.lookup("ctx", f"question about topic {i}", vecs[i])
            assert found.hit and found.payload == b"a%d" % i, i
    finally:
        cache.close()


def test_payloads_are_stored_compressed() -> None:
    payload = b'{"choices": [{"message": {"content": "' + b"lorem ipsum " * 200 + b'"}}]}'
    packed = pack(payload)
    assert len(packed) < len(payload) // 4 and unpack(packed) == payload
    assert unpack(pack(b"short")) == b"short"


def test_lookup_text_is_the_last_user_message() -> None:
    body = chat(
        "second question",
        history=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}],
    )
    assert last_user_text(body) == "second question"
    parts = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ],
    }
    assert last_user_text(parts) == "a\nb"
    image = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    }
    assert semantic_key("t", "r", image) is None  # not keyed on text it cannot see
    assert semantic_key("t", "r", {"model": "m", "messages": [{"role": "user", "content": "   "}]}) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 17 * 23?", "What is 17 * 24?"),
        ("What is 17 * 23?", "What is 17 + 23?"),
        ("Is it safe to fly?", "Is it not safe to fly?"),
        ("How do I learn C?", "How do I learn C++?"),
        ("How do I reset my password?", "How can I reset my password?"),
    ],
)
def test_a_differing_rule_key_is_always_a_hard_reject(a: str, b: str) -> None:
    ta, tb = analyse(a), analyse(b)
    if rule_key(ta) != rule_key(tb):
        assert hard_reject(ta, tb) is not None
    else:
        assert (ta.numbers, ta.operators, ta.negated, ta.code) == (
            tb.numbers,
            tb.operators,
            tb.negated,
            tb.code,
        )


def test_candidates_refused_by_their_rule_key_are_not_analysed_again(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry remembers its text's rule key, so a look-alike lookup with other numbers refuses
    it from that int: only the query (and the first refused candidate, for the reason) is
    analysed. The outcome is the one a full comparison gives."""
    for n in range(20, 28):
        h.put(chat(f"What is 17 * {n}?"), f"answer {n}")
    calls: list[str] = []
    real = semantic_module.analyse

    def counting(text: str) -> Any:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(semantic_module, "analyse", counting)
    first = h.get(chat("What is 17 * 99?"), threshold=0.0001)
    assert len(calls) == 1 + h.cache.candidates  # the query, then each candidate once (lazily)
    calls.clear()
    again = h.get(chat("What is 17 * 99?"), threshold=0.0001)
    assert len(calls) == 1  # the query: every candidate refused by its rule key
    assert not again.hit and again.score == 0.0 and again.reject == "numbers"
    assert (first.hit, first.score, first.reject) == (again.hit, again.score, again.reject)
    assert h.get(chat("what is 17 * 23"), threshold=0.0001).hit  # an equal key is still scored


def test_insert_keeps_the_rule_key_of_the_lookup(h: Harness) -> None:
    h.put(chat("What is 6 * 8?"), "48")  # the partition exists: the lookup analyses its query
    body = chat("What is 6 * 7?")
    key = semantic_key("t1", "auto", body)
    assert key is not None
    vec = h.emb.encode([key.text])[0]
    found = h.cache.lookup(key.context, key.text, vec)
    assert found.rules == rule_key(analyse(key.text))
    uid = h.cache.insert(key.context, key.text, vec, b"42", 60, found.rules)
    assert uid is not None
    entry = h.cache.entry(uid)
    assert entry is not None and entry.rules == found.rules
