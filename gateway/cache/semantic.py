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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.cache.online_threshold import EntryRecord, OnlinePolicy
from gateway.cache.semantic_index import DIM, PartitionIndex
from gateway.cache.verifier import Text, Verifier, analyse, hard_reject, rule_key

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
    online: EntryRecord | None = None  # its own threshold, once it has feedback (local only)
    aliases: list[int] | None = None  # index ids of confirmed paraphrases that point to it
    rules: int | None = None  # verifier_text.rule_key of its text, once known (local only)


@dataclass(frozen=True, slots=True)
class Lookup:
    """The best candidate of a lookup (hit or not): what the pipeline and the evaluator need."""

    hit: bool
    score: float  # verifier score of the best candidate (0 when none)
    cosine: float
    payload: bytes | None  # the cached response, on a hit
    matched: str | None  # the cached question, on a hit
    explain: Callable[[], str] | None = field(default=None, repr=False, compare=False)  # -> reject
    uid: str | None = None  # the best candidate's entry (hit or not): where feedback goes
    cut: float = 0.0  # the threshold the best candidate had to reach
    rules: int | None = None  # the query's verifier_text.rule_key (``insert`` reuses it)

    @property
    def reject(self) -> str | None:
        """Why the best candidate was refused, when it was (worked out only when asked: the
        serving path never reads it)."""
        return None if self.explain is None else self.explain()


class EntrySink(Protocol):
    """Where new entries are persisted (Redis); must never raise."""

    def put(self, entry: Entry, vector: Vector, ttl: float) -> None: ...


@dataclass(slots=True)
class _Alias:
    """A confirmed paraphrase of an entry, indexed under its own id."""

    eid: int  # the entry it answers for
    text: str


class SemanticCache:
    def __init__(
        self,
        verifier: Verifier,
        *,
        max_entries: int = 100_000,
        ivf_at: int = 8_192,
        candidates: int = 4,
        online: OnlinePolicy | None = None,
        max_aliases: int = 4,
    ) -> None:
        self.verifier = verifier
        self.online = online if online is not None else default_online(verifier)
        self.max_aliases = max_aliases
        self._aliases: dict[int, _Alias] = {}
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
        """The best candidate of ``context`` for ``text``. Each candidate must reach its own cut:
        ``threshold`` (default: the verifier's), lowered to the entry's learned threshold when
        its feedback justifies it (``online_threshold``), raised when a hit of it was refuted.
        A candidate may be an entry's confirmed paraphrase (``add_alias``): it is scored against
        that text and vector, and the hard rules are checked against the entry's own text too."""
        cut = self.verifier.threshold if threshold is None else threshold
        vector = np.asarray(vector, dtype=np.float32).reshape(DIM)
        part = self._parts.get(context)
        if part is None:
            return Lookup(False, 0.0, 0.0, None, None)
        scores, ids = part.search(vector, self.candidates)
        now = time.time()
        query = analyse(text)
        rules = rule_key(query)
        top_cosine = float(scores[0]) if len(scores) else 0.0
        best_score, best_cosine, best, best_cut = 0.0, top_cosine, None, cut
        reason: Callable[[], str] | None = None
        hit_score, hit_cosine, hit, hit_cut = -1.0, 0.0, None, cut
        for cosine, iid in zip(scores.tolist(), ids.tolist(), strict=True):
            alias = self._aliases.get(iid)
            eid = alias.eid if alias is not None else iid
            entry = self._entries.get(eid)
            if entry is None or entry.context != context:
                continue
            if entry.expires <= now:
                self._drop(eid)
                continue
            cached = self._candidate_text(entry, alias, rules)  # None: a hard reject by rule key
            score = 0.0 if cached is None else self.verifier.score(query, cached, vector, part.vector(iid))
            if score > 0.0 and alias is not None and hard_reject(query, analyse(entry.text)):
                score = 0.0
            if score <= 0.0 and best is None and reason is None:
                reason = self._explainer(query, cached or entry.text, cosine)
            own = self._cut(entry, cut)
            if score > best_score:
                best_score, best_cosine, best, best_cut = score, cosine, entry, own
            if score >= own and score > 0.0 and score > hit_score:
                hit_score, hit_cosine, hit, hit_cut = score, cosine, entry, own
        if hit is not None:
            payload = unpack(hit.payload)
            return Lookup(True, hit_score, hit_cosine, payload, hit.text, None, hit.uid, hit_cut, rules)
        if best is None:
            return Lookup(False, best_score, best_cosine, None, None, reason, rules=rules)
        return Lookup(False, best_score, best_cosine, None, None, reason, best.uid, best_cut, rules)

    def _explainer(self, query: Text, cached: Text | str, cosine: float) -> Callable[[], str]:
        def explain() -> str:
            text = analyse(cached) if isinstance(cached, str) else cached
            return self.verifier.reject_reason(query, text, cosine) or "alias"

        return explain

    @staticmethod
    def _candidate_text(entry: Entry, alias: _Alias | None, rules: int) -> Text | None:
        """The analysed text a candidate is scored on, or None when the entry's rule key
        differs from the query's (a certain hard reject: its text is not analysed again, the
        lookup's main cost once a partition holds many look-alike questions)."""
        if alias is not None:
            return analyse(alias.text)
        if entry.rules is not None and entry.rules != rules:
            return None
        cached = analyse(entry.text)
        entry.rules = rule_key(cached)
        return cached

    def _cut(self, entry: Entry, cut: float) -> float:
        rec = entry.online
        if rec is None:
            return cut
        if rec.threshold > self.online.start:
            return max(cut, rec.threshold)  # a refuted hit: stricter than anyone's default
        return min(cut, rec.threshold)

    # ------------------------------------------------------------------ feedback
    def entry(self, uid: str) -> Entry | None:
        """A live entry by its global id."""
        eid = self._by_uid.get(uid)
        return self._entries.get(eid) if eid is not None else None

    def observe(self, uid: str, score: float, correct: bool) -> bool:
        """Feedback on an entry: would (or did) its answer fit a query it scored ``score``
        against? False when the entry is gone."""
        entry = self.entry(uid)
        if entry is None:
            return False
        if entry.online is None:
            entry.online = EntryRecord(self.online.start)
        entry.online.observe(self.online, score, correct)
        return True

    def add_alias(self, uid: str, text: str, vector: Vector) -> bool:
        """Index ``text`` (confirmed to share the entry's answer) as another way to reach the
        entry; at most ``max_aliases`` per entry (the oldest replaced)."""
        eid = self._by_uid.get(uid)
        entry = self._entries.get(eid) if eid is not None else None
        if entry is None or eid is None or self.max_aliases <= 0:
            return False
        part = self._parts.get(entry.context)
        if part is None:
            return False
        aliases = entry.aliases if entry.aliases is not None else []
        entry.aliases = aliases
        if any(self._aliases[a].text == text for a in aliases) or text == entry.text:
            return False
        if len(aliases) >= self.max_aliases:
            old = aliases.pop(0)
            self._aliases.pop(old, None)
            part.remove(old)
        iid = self._next
        self._next += 1
        self._aliases[iid] = _Alias(eid, text)
        aliases.append(iid)
        part.add(np.array([iid], dtype=np.int64), np.asarray(vector, dtype=np.float32).reshape(1, DIM))
        return True

    def entry_payload(self, uid: str) -> bytes | None:
        """An entry's cached response (None when gone)."""
        entry = self.entry(uid)
        return None if entry is None else unpack(entry.payload)

    def entry_text(self, uid: str) -> str | None:
        """The question an entry answers (None when gone)."""
        entry = self.entry(uid)
        return None if entry is None else entry.text

    def entry_threshold(self, uid: str) -> float | None:
        """The entry's learned threshold (None: it has no feedback, or is gone)."""
        entry = self.entry(uid)
        return None if entry is None or entry.online is None else entry.online.threshold

    # ------------------------------------------------------------------ insert
    def insert(
        self, context: str, text: str, vector: Vector, payload: bytes, ttl: float, rules: int | None = None
    ) -> str | None:
        """Store an answer; returns its global id (None when it replaced nothing new). ``rules``:
        the text's ``rule_key`` when the caller has it (``Lookup.rules``), else learnt later."""
        uid = f"{time.time_ns():x}-{self._next:x}-{id(self) & 0xFFFF:x}"
        entry = Entry(uid, context, text, pack(payload), time.time() + ttl, rules=rules)
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
            for iid in entry.aliases or ():
                self._aliases.pop(iid, None)
                part.remove(iid)
            if part.live <= 0:
                del self._parts[entry.context]

    def wait_idle(self) -> None:
        for part in self._parts.values():
            part.wait_upgrade()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._entries.clear()
        self._by_uid.clear()
        self._aliases.clear()
        self._parts.clear()


def default_online(verifier: Verifier) -> OnlinePolicy:
    """The online policy of a verifier: entries start at its threshold; the band's floor is
    ``meta['online']['floor']`` when its weights carry one (else 0.5), the prior at a level is
    the level itself (the verifier's score is its P(same question))."""
    meta = verifier.meta.get("online") or {}
    table = tuple((float(a), float(p)) for a, p in meta.get("band_precision", ()))
    return OnlinePolicy(start=verifier.threshold, floor=float(meta.get("floor", 0.5)), prior_table=table)
