"""`switchyard eval semcache`: replay labelled question pairs through the real semantic cache
and measure hit rate, precision and recall over thresholds (numpy, faiss and the embedder come
with the caller's embedder; matplotlib only for the plot).

``text_a`` is stored as the answer to a one-message chat, ``text_b`` is looked up in the same
context (each pair in its own context, so pairs never meet), and the lookup's verifier score
decides the hit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache.semantic import SemanticCache
from gateway.cache.semantic_key import semantic_key

THRESHOLDS = [round(0.05 * i, 2) for i in range(1, 20)]


def rates(hits: list[bool], labels: list[int]) -> dict[str, Any]:
    n = len(labels)
    tp = sum(1 for h, y in zip(hits, labels, strict=True) if h and y == 1)
    nh = sum(hits)
    pos = sum(labels)
    return {
        "hit_rate": nh / n if n else 0.0,
        "precision": tp / nh if nh else 1.0,
        "recall": tp / pos if pos else 0.0,
        "hits": nh,
        "n": n,
    }


def replay(
    pairs: list[tuple[str, str, int]], embedder: Any, verifier: Any
) -> list[tuple[float, float, bool]]:
    """(verifier score, cosine, hit at the default threshold) per pair, through SemanticCache."""
    cache = SemanticCache(verifier, max_entries=max(1, len(pairs)))
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    row = {t: i for i, t in enumerate(texts)}
    out = []
    try:
        for i, (a, b, _) in enumerate(pairs):
            key_a = semantic_key(
                f"eval-{i}", "eval", {"model": "eval", "messages": [{"role": "user", "content": a}]}
            )
            key_b = semantic_key(
                f"eval-{i}", "eval", {"model": "eval", "messages": [{"role": "user", "content": b}]}
            )
            assert key_a is not None and key_b is not None and key_a.context == key_b.context
            cache.insert(key_a.context, key_a.text, vecs[row[a]], b'{"pair": %d}' % i, ttl=3600.0)
            found = cache.lookup(key_b.context, key_b.text, vecs[row[b]])
            out.append((found.score, found.cosine, found.hit))
    finally:
        cache.close()
    return out


def plot_precision_recall(
    path: Path, curve: list[dict[str, Any]], cosine_curve: list[dict[str, Any]], default: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([c["recall"] for c in curve], [c["precision"] for c in curve], "o-", label="verifier score")
    ax.plot(
        [c["recall"] for c in cosine_curve],
        [c["precision"] for c in cosine_curve],
        "s--",
        label="cosine only",
    )
    ax.plot([default["recall"]], [default["precision"]], "r*", markersize=14, label="default setting")
    ax.axhline(0.95, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("recall (true repeats answered from cache)")
    ax.set_ylabel("precision (hits that were right)")
    ax.set_title("Semantic cache: precision-recall over thresholds")
    ax.set_xlim(0, 1)
    ax.set_ylim(0.4, 1.01)
    ax.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
