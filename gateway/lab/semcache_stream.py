"""Streams of queries over labelled pairs, through the real semantic cache, with feedback.

``switchyard eval semcache --stream`` (see ``gateway.cli.semcache``). The pairs form a graph
(texts are nodes, labelled pairs edges); each connected component is one cache context (its
questions only ever meet each other), and its texts arrive in a seeded random order, each once
(an exact repeat would be the exact cache's). A query is looked up; on a miss the "upstream"
answers and the query is stored as a new entry, as the gateway does.

Whether a hit was right: the pair's own label when the two texts were labelled, else the same
duplicate cluster (union of the positive edges) = right, a labelled negative between the two
clusters = wrong, else unknown (counted apart, left out of the precision). A query is
*answerable* when an earlier text of its stream is in its duplicate cluster; recall = right
hits / answerable queries.

Feedback, as the gateway gets it (``SemanticLayer.store``): on a miss whose best candidate
scored in the band, the fresh answer is compared with the candidate's; the judge is sound (it
never confirms a wrong candidate: an identical answer is a right one) but confirms a right one
only with probability ``judge_recall`` (a paraphrase may get other words back), else it says
"wrong". A sampled share ``shadow_rate`` of hits below the start threshold is also checked
against the upstream (costing that call). Modes: ``static`` (no feedback: the pair-level
behaviour), ``online`` (per-entry thresholds), ``online+aliases`` (a confirmed query is also
indexed as a paraphrase of the entry it matched)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache.online_threshold import OnlinePolicy
from gateway.cache.semantic import SemanticCache
from gateway.cache.verifier import Verifier

MODES = ("static", "online", "online+aliases")


class _Clusters:
    """Union-find over texts joined by positive labels, plus the labelled pairs themselves."""

    def __init__(self, pairs: Sequence[tuple[str, str, int]]) -> None:
        self.parent: dict[str, str] = {}
        self.label: dict[tuple[str, str], int] = {}
        for a, b, y in pairs:
            self.label[(a, b)] = self.label[(b, a)] = y
            if y == 1:
                self._union(a, b)
        self.negative: set[tuple[str, str]] = set()
        for a, b, y in pairs:
            if y == 0:
                ra, rb = self.find(a), self.find(b)
                self.negative.add((ra, rb))
                self.negative.add((rb, ra))

    def find(self, x: str) -> str:
        root = self.parent.setdefault(x, x)
        while root != self.parent[root]:
            root = self.parent[root]
        while x != root:
            x, self.parent[x] = self.parent[x], root
        return root

    def _union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def same(self, a: str, b: str) -> bool | None:
        """Right to answer ``a`` with ``b``'s answer? None when nothing says."""
        y = self.label.get((a, b))
        if y is not None:
            return y == 1
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        return False if (ra, rb) in self.negative else None


def components(pairs: Sequence[tuple[str, str, int]]) -> list[list[str]]:
    """Connected components of the pair graph (any label), texts in first-seen order."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        root = parent.setdefault(x, x)
        while root != parent[root]:
            root = parent[root]
        while x != root:
            x, parent[x] = parent[x], root
        return root

    order: dict[str, None] = {}
    for a, b, _ in pairs:
        order[a] = order[b] = None
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for t in order:
        groups.setdefault(find(t), []).append(t)
    return list(groups.values())


@dataclass
class StreamResult:
    mode: str
    queries: int = 0
    answerable: int = 0
    hits: int = 0
    right: int = 0
    wrong: int = 0
    unknown: int = 0
    band_hits: int = 0  # hits below the start threshold (thanks to feedback)
    band_wrong: int = 0
    feedback: int = 0
    shadow_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        judged = self.right + self.wrong
        return {
            "mode": self.mode,
            "queries": self.queries,
            "answerable": self.answerable,
            "hits": self.hits,
            "precision": round(self.right / judged, 4) if judged else 1.0,
            "recall": round(self.right / self.answerable, 4) if self.answerable else 0.0,
            "right": self.right,
            "wrong": self.wrong,
            "unknown": self.unknown,
            "band_hits": self.band_hits,
            "band_precision": round(1 - self.band_wrong / self.band_hits, 4) if self.band_hits else None,
            "feedback": self.feedback,
            "shadow_calls": self.shadow_calls,
        }


def simulate(
    pairs: Sequence[tuple[str, str, int]],
    vectors: dict[str, npt.NDArray[np.float32]],
    verifier: Verifier,
    mode: str,
    *,
    online: OnlinePolicy | None = None,
    judge_recall: float = 0.7,
    shadow_rate: float = 0.1,
    seed: int = 0,
    min_component: int = 2,
) -> StreamResult:
    """One pass over every component's stream in ``mode`` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} ({', '.join(MODES)})")
    truth = _Clusters(pairs)
    order_rng = random.Random(seed)  # the streams' order: the same in every mode
    rng = random.Random(seed + 1)  # the judge's and the shadow checks' draws
    out = StreamResult(mode)
    cache = SemanticCache(verifier, max_entries=max(1, len(vectors)), online=online)
    policy = cache.online
    learn, aliases = mode != "static", mode == "online+aliases"
    try:
        for n, texts in enumerate(components(pairs)):
            if len(texts) < min_component:
                continue
            order = list(texts)
            order_rng.shuffle(order)
            context = f"stream-{n}"
            seen_clusters: set[str] = set()
            for q in order:
                out.queries += 1
                cluster = truth.find(q)
                if cluster in seen_clusters:
                    out.answerable += 1
                seen_clusters.add(cluster)
                found = cache.lookup(context, q, vectors[q])
                if found.hit:
                    assert found.matched is not None
                    ok = truth.same(q, found.matched)
                    out.hits += 1
                    below = found.score < policy.start
                    if ok is None:
                        out.unknown += 1
                    else:
                        out.right += ok
                        out.wrong += not ok
                    if below:
                        out.band_hits += 1
                        out.band_wrong += ok is False
                    if learn and below and found.uid and rng.random() < shadow_rate:
                        out.shadow_calls += 1
                        if ok is not None:
                            verdict = ok and rng.random() < judge_recall
                            cache.observe(found.uid, found.score, verdict)
                            out.feedback += 1
                    continue
                # a miss: the upstream answers, the answer is stored; the band candidate is judged
                if learn and found.uid and policy.floor <= found.score < found.cut and found.matched is None:
                    uid = found.uid
                    entry_text = cache.entry_text(uid)
                    ok = truth.same(q, entry_text) if entry_text is not None else None
                    if ok is not None:
                        verdict = ok and rng.random() < judge_recall
                        cache.observe(uid, found.score, verdict)
                        out.feedback += 1
                        if aliases and verdict:
                            cache.add_alias(uid, q, vectors[q])
                            continue  # the query is now reachable through the entry it matched
                cache.insert(context, q, vectors[q], b"answer", ttl=3600.0)
    finally:
        cache.close()
    return out


def embed_texts(embedder: Any, pairs: Sequence[tuple[str, str, int]]) -> dict[str, npt.NDArray[np.float32]]:
    """Every distinct text's vector, fp16-rounded as the cache stores it."""
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    vecs = vecs.astype(np.float16).astype(np.float32)
    return {t: vecs[i] for i, t in enumerate(texts)}


def stream_table(
    pairs: Sequence[tuple[str, str, int]],
    vectors: dict[str, npt.NDArray[np.float32]],
    verifier: Verifier,
    *,
    judge_recalls: Sequence[float] = (1.0, 0.7),
    min_component: int = 3,
    seed: int = 0,
    online: OnlinePolicy | None = None,
) -> list[dict[str, Any]]:
    """One row per (mode, judge recall): static once, the online modes at each judge recall."""
    rows = []
    for mode in MODES:
        for jr in judge_recalls[:1] if mode == "static" else judge_recalls:
            res = simulate(
                pairs, vectors, verifier, mode, online=online, judge_recall=jr, seed=seed,
                min_component=min_component,
            )  # fmt: skip
            rows.append({**res.as_dict(), "judge_recall": None if mode == "static" else jr})
    return rows
