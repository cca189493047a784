"""The shared MiniLM embedder: ONNX int8 backend == torch vector space, micro-batching, laziness."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.semcache_support import embedder, qqp_rows  # noqa: F401

SENTENCES = [
    "What is 17 * 23?",
    "How do I reset my password?",
    "Explain the theory of relativity in simple terms for a child.",
    "hello",
    "Write a Python function that reverses a linked list in place.",
    "Quelle est la capitale de la France ?",
    "word " * 300,  # longer than the 256-token window: truncated like sentence-transformers does
]


def test_shape_dtype_and_unit_norm(embedder: Any) -> None:  # noqa: F811
    vecs = embedder.encode(SENTENCES)
    assert vecs.shape == (len(SENTENCES), 384) and embedder.dim == 384
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert embedder.encode([]).shape == (0, 384)
    assert embedder.space == "sentence-transformers/all-MiniLM-L6-v2"


def test_onnx_backend_reproduces_torch_vectors(embedder: Any) -> None:  # noqa: F811
    """The classifier is trained on torch vectors: the fast backend must stay in that space."""
    from gateway.cache.embedder import load_embedder

    if embedder.name != "minilm-l6-onnx-int8":
        pytest.skip("onnxruntime not installed: the embedder is torch itself")
    rows = qqp_rows(150)
    texts = SENTENCES + [r["text_a"] for r in rows] + [r["text_b"] for r in rows]
    reference = load_embedder("torch")
    cos = (embedder.encode(texts) * reference.encode(texts)).sum(axis=1)
    assert cos.min() >= 0.98, (float(cos.min()), texts[int(cos.argmin())])
    assert float(np.median(cos)) >= 0.99


def test_similar_questions_are_close_and_unrelated_far(embedder: Any) -> None:  # noqa: F811
    a, b, c = embedder.encode(
        [
            "How can I reset my password?",
            "How do I change my password?",
            "What is the boiling point of water?",
        ]
    )
    assert float(a @ b) > 0.8 > 0.3 > float(a @ c)


async def test_embed_micro_batches_concurrent_callers(embedder: Any) -> None:  # noqa: F811
    texts = [f"question number {i}: how do I bake bread at altitude {i * 100} m?" for i in range(64)]
    expected = embedder._encode_fn(texts)  # the backend itself: encode() would fill the LRU
    before_batches, before_texts = embedder.batches, embedder.batched_texts
    got = await asyncio.gather(*(embedder.embed(t) for t in texts))
    batches = embedder.batches - before_batches
    assert embedder.batched_texts - before_texts == 64
    assert batches < 64  # concurrent callers shared batches
    np.testing.assert_allclose(np.stack(got), expected, atol=1e-5)  # a vector never depends on its batch


async def test_embed_propagates_errors_and_keeps_working() -> None:
    from gateway.cache.embedder import Embedder

    def encode(texts: Any) -> Any:
        if any(t == "boom" for t in texts):
            raise RuntimeError("backend failed")
        return np.ones((len(texts), 384), dtype=np.float32) / np.sqrt(384)

    emb = Embedder("test-backend", encode, linger_s=0.002)
    try:
        with pytest.raises(RuntimeError, match="backend failed"):
            await emb.embed("boom")
        vec = await emb.embed("fine")
        assert vec.shape == (384,)
    finally:
        emb.close()


def test_unknown_backend_is_an_error() -> None:
    from gateway.cache.embedder import load_embedder

    with pytest.raises(ValueError, match="unknown embedder backend"):
        load_embedder("word2vec")


def test_gateway_import_loads_no_model_libraries() -> None:
    """Start-up cost: the app, pipeline and semantic layer import without numpy/torch/faiss/onnx."""
    code = (
        "import sys; import gateway.api.app, gateway.flow.pipeline, gateway.cache.semantic_layer, gateway.cli;"
        "heavy = [m for m in ('numpy', 'torch', 'faiss', 'onnxruntime', 'sentence_transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def _counting_backend(calls: list[list[str]]) -> Any:
    def encode(texts: Any) -> Any:
        calls.append(list(texts))
        rng = [np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(384) for t in texts]
        vecs = np.asarray(rng, dtype=np.float32).reshape(len(texts), 384)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    return encode


async def test_exact_repeats_come_from_the_lru_without_the_model() -> None:
    from gateway.cache.embedder import Embedder

    calls: list[list[str]] = []
    emb = Embedder("test-backend", _counting_backend(calls), cache_size=2)
    try:
        first = emb.encode(["a", "b", "a"])  # a repeat inside one call is encoded once
        assert calls == [["a", "b"]] and np.array_equal(first[0], first[2])
        again = await emb.embed("a")  # from the LRU: no model call, no worker batch
        assert calls == [["a", "b"]] and emb.batches == 0
        np.testing.assert_array_equal(again, first[0])
        again[:] = 0  # callers get their own copy: the cached vector is untouched
        np.testing.assert_array_equal(emb.encode(["a"])[0], first[0])
        emb.encode(["c"])  # size 2: "b" (least recently used) is evicted, "a" stays
        assert calls[-1] == ["c"] and len(emb.cache) == 2
        emb.encode(["b", "a"])
        assert calls[-1] == ["b"]
        assert emb.cache.hits >= 3 and emb.cache.misses >= 4
        off = Embedder("test-backend", _counting_backend(calls), cache_size=0)
        off.encode(["a"])
        off.encode(["a"])
        assert calls[-2:] == [["a"], ["a"]] and len(off.cache) == 0
    finally:
        emb.close()


def test_onnx_vector_does_not_depend_on_its_batch(embedder: Any) -> None:  # noqa: F811
    """int8 dynamic quantisation scales per run: one text per run keeps a text's vector its own
    (the classifier and the verifier were trained on single-text vectors)."""
    from gateway.cache.embedder import Embedder

    if embedder.name != "minilm-l6-onnx-int8":
        pytest.skip("onnxruntime not installed")
    fresh = Embedder(embedder.name, embedder._encode_fn, cache_size=0)
    alone = np.stack([fresh.encode([t])[0] for t in SENTENCES])
    together = fresh.encode(SENTENCES)
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_truncation_matches_the_packaged_model() -> None:
    """Serving (onnx) and training (sentence-transformers) cut texts at the same token count."""
    import json

    from gateway.cache import embed_backends

    config = json.loads((embed_backends._model_dir() / "sentence_bert_config.json").read_text())
    assert embed_backends.MAX_TOKENS == config["max_seq_length"] == 256


async def test_a_batch_wakes_each_event_loop_once() -> None:
    """The worker hands a whole batch back with one call_soon_threadsafe per event loop (each
    call is a wake-up of the loop), and every caller still gets its own vector."""
    from gateway.cache.embedder import Embedder

    def encode(texts: Any) -> Any:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = [float(t.split()[-1]) for t in texts]
        return out

    emb = Embedder("test-backend", encode, linger_s=0.005, cache_size=0)
    loop = asyncio.get_running_loop()
    real = loop.call_soon_threadsafe
    wakeups = 0

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal wakeups
        wakeups += 1
        return real(*args, **kw)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        got = await asyncio.gather(*(emb.embed(f"text {i}") for i in range(48)))
    finally:
        del loop.call_soon_threadsafe
        emb.close()
    assert [float(v[0]) for v in got] == [float(i) for i in range(48)]
    assert emb.batched_texts == 48 and emb.batches < 48
    assert wakeups == emb.batches


def test_the_served_session_stays_on_the_fused_sessions_vectors(
    embedder: Any,  # noqa: F811
    shared_model_dir: Path,
    tmp_path: Path,
) -> None:
    """The served int8 session leaves ORT's SkipLayerNormFusion out (embed_backends.
    DISABLED_OPTIMIZERS, for speed): the vectors must stay those of the session the verifier and
    the router were calibrated on, but for rounding (median cosine 1.0, none below 0.99)."""
    import onnxruntime as ort

    from gateway.cache import embed_backends

    if embedder.name != "minilm-l6-onnx-int8":
        pytest.skip("onnxruntime not installed")
    source, path = embed_backends.onnx_source(tmp_path, shared_model_dir)  # the file the fixture runs
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fused = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    tok = embed_backends.load_tokenizer()
    texts = SENTENCES + [r["text_a"] for r in qqp_rows(100)]
    want = np.empty((len(texts), 384), dtype=np.float32)
    for i, text in enumerate(texts):
        ids = np.asarray([tok.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        want[i] = fused.run(None, feeds)[0][0].mean(axis=0)
    cos = (embedder._encode_fn(texts) * embed_backends._normalise(want)).sum(axis=1)
    assert float(np.median(cos)) >= 0.99999 and float(cos.min()) >= 0.99, (float(cos.min()), source)
