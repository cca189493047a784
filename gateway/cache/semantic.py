"""The semantic cache: answers to questions that were asked before in other words.

Entries live in partitions keyed by a *context id* (tenant + route + everything in the
request but the last user message, see ``semantic_key``), so a lookup only ever meets
entries of the same tenant, route and conversation context. Inside a partition a faiss index
finds the nearest cached questions; the verifier (hard rules + a learned model) decides.

Bounded by ``max_entries`` (oldest first out) and per-entry TTLs. Payloads are stored
compressed. With a ``RedisSemanticStore`` attached, new entries are also written to Redis;
``load``/``apply`` rebuild and refresh the local index from there (``semantic_redis``)."""

from __future__ import annotations

import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.cache.semantic_index import DIM, PartitionIndex
from gateway.cache.verifier import Verifier, analyse

Vector = npt.NDArray[np.float32]
_ZLIB = b"z"
_RAW = b"r"


def pack(payload: bytes) -> bytes:
    if len(payload) >= 256:
        packed = zlib.compress(payload, 1)
        if len(packed) < len(payload):
            return _ZLIB + packed
    return _RAW + payload


def unpack(stored: bytes) -> bytes:
    return zlib.decompress(stored[1:]) if stored[:1] == _ZLIB else stored[1:]


@dataclass(slots=True)
class Entry:
    uid: str  # global id (shared through Redis)
    context: str
    text: str
    payload: bytes  # packed
    expires: float  # wall-clock seconds


@dataclass(frozen=True, slots=True)
class Lookup:
    """The best candidate of a lookup (hit or not): what the pipeline and the evaluator need."""

    hit: bool
    score: float  # verifier score of the best candidate (0 when none)
    cosine: float
    payload: bytes | None  # the cached response, on a hit
    matched: str | None  # the cached question, on a hit
    reject: str | None = None  # why the best candidate was refused, when it was


class EntrySink(Protocol):
    """Where new entries are persisted (Redis); must never raise."""

    def put(self, entry: Entry, vector: Vector, ttl: float) -> None: ...


class SemanticCache:
    def __init__(
        self,
        verifier: Verifier,
        *,
        max_entries: int = 100_000,
        ivf_at: int = 8_192,
        candidates: int = 4,
    ) -> None:
        self.verifier = verifier
        self.max_entries = max_entries
        self.candidates = candidates
        self._ivf_at = ivf_at
        self._entries: dict[int, Entry] = {}  # insertion order = eviction order (oldest first)
        self._by_uid: dict[str, int] = {}
        self._parts: dict[str, PartitionIndex] = {}
        self._next = 1
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-semcache")
        self.sink: EntrySink | None = None
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def partitions(self) -> int:
        return len(self._parts)

    def partition(self, context: str) -> PartitionIndex | None:
        return self._parts.get(context)

    # ------------------------------------------------------------------ lookup
    def lookup(self, context: str, text: str, vector: Vector, threshold: float | None = None) -> Lookup:
        cut = self.verifier.threshold if threshold is None else threshold
        vector = np.asarray(vector, dtype=np.float32).reshape(DIM)
        part = self._parts.get(context)
        if part is None:
            return Lookup(False, 0.0, 0.0, None, None)
        scores, ids = part.search(vector, self.candidates)
        now = time.time()
        query = analyse(text)
        top_cosine = float(scores[0]) if len(scores) else 0.0
        best_score, best_cosine, best, reason = 0.0, top_cosine, None, None
        for cosine, eid in zip(scores.tolist(), ids.tolist(), strict=True):
            entry = self._entries.get(eid)
            if entry is None or entry.context != context:
                continue
            if entry.expires <= now:
                self._drop(eid)
                continue
            cached = analyse(entry.text)
            score = self.verifier.score(query, cached, vector, part.vector(eid))
            if score > best_score:
                best_score, best_cosine, best = score, cosine, entry
            elif best is None and reason is None:
                reason = self.verifier.reject_reason(query, cached, cosine)
        if best is None or best_score < cut:
            return Lookup(False, best_score, best_cosine, None, None, reason)
        return Lookup(True, best_score, best_cosine, unpack(best.payload), best.text)

    # ------------------------------------------------------------------ insert
    def insert(self, context: str, text: str, vector: Vector, payload: bytes, ttl: float) -> str | None:
        """Store an answer; returns its global id (None when it replaced nothing new)."""
        uid = f"{time.time_ns():x}-{self._next:x}-{id(self) & 0xFFFF:x}"
        entry = Entry(uid, context, text, pack(payload), time.time() + ttl)
        self.add_entry(entry, vector)
        if self.sink is not None:
            self.sink.put(entry, vector, ttl)
        return uid

    def add_entry(self, entry: Entry, vector: Vector) -> bool:
        """Add an entry built elsewhere (Redis); False when known or expired."""
        if entry.uid in self._by_uid or entry.expires <= time.time():
            return False
        eid = self._next
        self._next += 1
        self._entries[eid] = entry
        self._by_uid[entry.uid] = eid
        part = self._parts.get(entry.context)
        if part is None:
            part = self._parts[entry.context] = PartitionIndex(self._ivf_at, self._executor)
        part.add(np.array([eid], dtype=np.int64), np.asarray(vector, dtype=np.float32).reshape(1, DIM))
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._expire_oldest(now=time.time())
        return True

    def _expire_oldest(self, now: float, budget: int = 8) -> None:
        """Drop up to ``budget`` expired entries from the old end (amortised upkeep on insert;
        lookups skip and drop any other expired entry they meet)."""
        for _ in range(budget):
            eid = next(iter(self._entries), None)
            if eid is None or self._entries[eid].expires > now:
                return
            self._drop(eid)

    def add_many(self, entries: list[Entry], vectors: Vector) -> int:
        """Bulk add (rebuild from Redis, benchmarks): one faiss call per partition."""
        now = time.time()
        groups: dict[str, list[int]] = {}
        rows: dict[str, list[int]] = {}
        for row, entry in enumerate(entries):
            if entry.uid in self._by_uid or entry.expires <= now:
                continue
            eid = self._next
            self._next += 1
            self._entries[eid] = entry
            self._by_uid[entry.uid] = eid
            groups.setdefault(entry.context, []).append(eid)
            rows.setdefault(entry.context, []).append(row)
        for context, eids in groups.items():
            part = self._parts.get(context)
            if part is None:
                part = self._parts[context] = PartitionIndex(self._ivf_at, self._executor)
            part.add(np.asarray(eids, dtype=np.int64), vectors[rows[context]])
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        return sum(len(e) for e in groups.values())

    def _drop(self, eid: int) -> None:
        entry = self._entries.pop(eid, None)
        if entry is None:
            return
        self._by_uid.pop(entry.uid, None)
        part = self._parts.get(entry.context)
        if part is not None:
            part.remove(eid)
            if part.live <= 0:
                del self._parts[entry.context]

    def wait_idle(self) -> None:
        for part in self._parts.values():
            part.wait_upgrade()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._entries.clear()
        self._by_uid.clear()
        self._parts.clear()
