"""The in-memory lookup cache in front of a key store (limits/keys.py), and the database
errors a store may raise."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from gateway.limits.keys import KeyRecord, KeyStoreBase, hash_key, plausible

V = TypeVar("V")


def store_errors() -> tuple[type[Exception], ...]:
    """The database errors a key store may raise (psycopg's only once it has been imported)."""
    pg = sys.modules.get("psycopg")
    return (sqlite3.Error,) if pg is None else (sqlite3.Error, pg.Error)


class KeyCache:
    """Serves repeated key lookups from memory.

    Positive entries live ``ttl`` seconds, so a revocation (possibly by another process)
    takes effect within ``ttl``; sooner with a ``KeyWatch`` (limits/key_watch.py), which clears
    the cache as soon as the store's change counter moves. A record read from the store carries
    the key's own limits, handed to ``on_record`` before the caller admits the request.
    Unknown keys are remembered for ``negative_ttl`` seconds in a bounded LRU (``max_negative``
    entries), so a flood of random keys costs at most one database read each and cannot grow
    memory without bound. Entries are keyed by the key's hash; the key itself is not kept.

    While the store is unreachable (PostgreSQL down), a key it confirmed keeps working for at
    most ``stale`` seconds after that confirmation; then it gets 503 like an unknown key. So a
    revocation this process could not see takes effect within ``stale`` even mid-outage
    (``stale`` equal to ``ttl``: within the TTL, outage or not; the gateway reads both from
    ``server.key_cache_ttl_s`` and ``server.key_outage_grace_s``).
    """

    def __init__(
        self,
        store: KeyStoreBase,
        ttl: float = 5.0,
        negative_ttl: float = 1.0,
        *,
        max_entries: int = 100_000,
        max_negative: int = 10_000,
        stale: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_record: Callable[[KeyRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.on_record = on_record  # told each record read from the store (its limits: Limits.learn)
        self.ttl = ttl
        self.stale = max(stale, ttl)
        self.negative_ttl = negative_ttl
        self.max_entries = max_entries
        self.max_negative = max_negative
        self._clock = clock
        self._hits: OrderedDict[str, tuple[float, KeyRecord]] = OrderedDict()
        self._confirmed: dict[str, float] = {}  # digest -> when the store last confirmed it
        self._misses: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()  # guards evictions; reads are single dict operations
        self.version: int | None = None  # the store's change counter as a KeyWatch last read it

    def lookup(self, key: str, ttl: float | None = None, stale: float | None = None) -> KeyRecord | None:
        """The active record for ``key`` (from memory when fresh), or None. ``ttl`` and
        ``stale`` override the cache's own for this lookup (the running policy's values)."""
        if not plausible(key):
            return None
        ttl = self.ttl if ttl is None else ttl
        stale = self.stale if stale is None else max(stale, ttl)
        digest = hash_key(key)
        now = self._clock()
        hit = self._hits.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        miss = self._misses.get(digest)
        if miss is not None:
            if miss > now:
                return None
            self._misses.pop(digest, None)
        try:
            record = self.store.lookup_hash(digest)
        except store_errors():
            confirmed = self._confirmed.get(digest)
            if hit is None or confirmed is None or now - confirmed >= stale:
                raise
            # The store is unreachable (e.g. PostgreSQL down): keep honouring a key it confirmed
            # recently (less than ``stale`` ago) rather than failing every caller.
            until = min(now + ttl, confirmed + stale)
            self._remember(self._hits, digest, (until, hit[1]), self.max_entries)
            return hit[1]
        if record is None:
            self._hits.pop(digest, None)
            self._confirmed.pop(digest, None)
            self._remember(self._misses, digest, now + self.negative_ttl, self.max_negative)
        else:
            if self.on_record is not None:
                self.on_record(record)  # its limits are known before the request is admitted
            self._remember(self._hits, digest, (now + ttl, record), self.max_entries)
            if len(self._confirmed) >= self.max_entries:
                self._confirmed.clear()  # bounded; a key not in it is simply re-confirmed
            self._confirmed[digest] = now
        return record

    def _remember(self, cache: OrderedDict[str, V], digest: str, value: V, limit: int) -> None:
        with self._lock:
            cache[digest] = value
            cache.move_to_end(digest)
            while len(cache) > limit:
                cache.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (e.g. right after a revocation in this process)."""
        with self._lock:
            self._hits.clear()
            self._misses.clear()
            self._confirmed.clear()

    def sizes(self) -> tuple[int, int]:
        """(positive entries, negative entries) currently held."""
        return len(self._hits), len(self._misses)
