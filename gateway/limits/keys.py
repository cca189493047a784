"""Virtual API keys, stored only as SHA-256 hashes, plus a small in-memory lookup cache.

A key looks like ``sk-sy-<43 url-safe chars>``. The database keeps its SHA-256 hex digest and
a short non-secret ``key_id`` (the first 12 hex chars of that digest) used in logs, the
ledger and the CLI. The key itself is shown once, at creation, and never stored.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Generic, Protocol, Self, TypeVar

KEY_PREFIX: Final = "sk-sy-"
KEY_ID_LEN: Final = 12
TENANT_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_MAX: Final = 200
KEY_MAX_LEN: Final = 256  # longer strings are not keys; don't spend time hashing them
V = TypeVar("V")
_BUSY_TIMEOUT_MS: Final = 5000


def schema_sql(real: str) -> tuple[str, ...]:
    """The key tables (created if absent); ``real`` is the dialect's floating-point type."""
    return (
        f"""CREATE TABLE IF NOT EXISTS api_keys (
        key_id TEXT PRIMARY KEY,
        key_hash TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        name TEXT,
        created_at {real} NOT NULL,
        revoked_at {real}
    )""",
        "CREATE INDEX IF NOT EXISTS ix_api_keys_tenant ON api_keys (tenant)",
        """CREATE TABLE IF NOT EXISTS key_limits (
        key_id TEXT PRIMARY KEY REFERENCES api_keys (key_id),
        rpm INTEGER,
        tpm INTEGER,
        daily_usd TEXT,
        monthly_usd TEXT
    )""",
        # One counter bumped after every revoke and limits change (by any replica or the CLI):
        # replicas poll it (KeyWatch) and drop what they cached when it moves.
        "CREATE TABLE IF NOT EXISTS key_store_version "
        "(one INTEGER PRIMARY KEY CHECK (one = 1), version BIGINT NOT NULL)",
        "INSERT INTO key_store_version (one, version) VALUES (1, 0) ON CONFLICT (one) DO NOTHING",
    )


# Statements shared by every backend, written with "?" placeholders (a backend using another
# paramstyle rewrites them). The upsert syntax is common to SQLite >= 3.24 and PostgreSQL.
_INSERT_KEY: Final = (
    "INSERT INTO api_keys (key_id, key_hash, tenant, name, created_at) VALUES (?, ?, ?, ?, ?)"
)
_SELECT_KEY: Final = (
    "SELECT k.key_id, k.key_hash, k.tenant, k.name, k.created_at, k.revoked_at, "
    "l.rpm, l.tpm, l.daily_usd, l.monthly_usd "
    "FROM api_keys k LEFT JOIN key_limits l ON l.key_id = k.key_id WHERE k.key_id = ?"
)
_VERSION: Final = "SELECT version FROM key_store_version WHERE one = 1"
_BUMP: Final = "UPDATE key_store_version SET version = version + 1 WHERE one = 1"
_SELECT_ALL: Final = "SELECT key_id, tenant, name, created_at, revoked_at FROM api_keys"
_REVOKE: Final = "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL"
_IS_ACTIVE: Final = "SELECT 1 FROM api_keys WHERE key_id = ? AND revoked_at IS NULL"
_UPSERT_LIMITS: Final = (
    "INSERT INTO key_limits (key_id, rpm, tpm, daily_usd, monthly_usd) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (key_id) DO UPDATE SET rpm = excluded.rpm, tpm = excluded.tpm, "
    "daily_usd = excluded.daily_usd, monthly_usd = excluded.monthly_usd"
)
_SELECT_LIMITS: Final = (
    "SELECT l.key_id, l.rpm, l.tpm, l.daily_usd, l.monthly_usd FROM key_limits l "
    "JOIN api_keys k ON k.key_id = l.key_id WHERE k.revoked_at IS NULL"
)


def validate_tenant(tenant: str) -> str:
    """Return ``tenant`` if it is a valid tenant name, else raise ValueError."""
    if not isinstance(tenant, str) or TENANT_RE.fullmatch(tenant) is None:
        raise ValueError(
            f"invalid tenant name {tenant!r}: 1-64 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit"
        )
    return tenant


def hash_key(key: str) -> str:
    """SHA-256 hex digest of ``key`` (what the database stores)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's own limits (None: none of its own; policy defaults apply to rpm/tpm)."""

    rpm: int | None = None
    tpm: int | None = None
    daily_usd: Decimal | None = None
    monthly_usd: Decimal | None = None

    @property
    def empty(self) -> bool:
        return self.rpm is None and self.tpm is None and self.daily_usd is None and self.monthly_usd is None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What is known about a key; never the key itself nor its full hash."""

    key_id: str
    tenant: str
    name: str | None
    created_at: float  # unix seconds
    revoked_at: float | None = None
    limits: KeyLimits = field(default=KeyLimits(), compare=False)  # its own, read with it (lookups)

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


MAX_LIMIT = 10**9  # rpm, tpm and USD: more is no limit at all and overflows counters and gauges


def _limits_row(r: tuple[object, ...]) -> KeyLimits:
    return KeyLimits(
        None if r[0] is None else int(str(r[0])),
        None if r[1] is None else int(str(r[1])),
        None if r[2] is None else Decimal(str(r[2])),
        None if r[3] is None else Decimal(str(r[3])),
    )


def _plausible(key: object) -> bool:
    return isinstance(key, str) and key.startswith(KEY_PREFIX) and len(key) <= KEY_MAX_LEN


class KeyStoreBase(ABC):
    """The key store's behaviour, over three primitives a backend provides (``_rows``,
    ``_change``, ``_insert_new``), each running one statement written with "?" placeholders.

    A backend keeps one connection per process (``SharedConnectionStore``). Call ``close()``
    when done (or use the store as a context manager)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""

    @abstractmethod
    def _rows(self, sql: str, params: tuple[object, ...]) -> builtins.list[tuple[Any, ...]]:
        """Run a query and return all its rows."""

    @abstractmethod
    def _change(self, sql: str, params: tuple[object, ...]) -> int:
        """Run a statement and return how many rows it changed."""

    @abstractmethod
    def _insert_new(self, sql: str, params: tuple[object, ...]) -> bool:
        """Run an INSERT; False (nothing inserted) if it violates a unique constraint."""

    def create(self, tenant: str, name: str | None = None) -> tuple[str, KeyRecord]:
        """Make a new key for ``tenant``. Returns the key (shown once) and its record."""
        validate_tenant(tenant)
        if name is not None and (len(name) > NAME_MAX or not name.isprintable()):
            raise ValueError(f"invalid key name: at most {NAME_MAX} printable characters")
        for _ in range(5):
            key = KEY_PREFIX + secrets.token_urlsafe(32)
            digest = hash_key(key)
            record = KeyRecord(digest[:KEY_ID_LEN], tenant, name, time.time())
            params = (record.key_id, digest, tenant, name, record.created_at)
            if self._insert_new(_INSERT_KEY, params):
                return key, record  # no replica holds anything about it yet: nothing to announce
            # key_id collision (48 bits): draw again
        raise RuntimeError("could not allocate a unique key id")  # pragma: no cover

    def lookup(self, key: str) -> KeyRecord | None:
        """The active record for ``key``; None if unknown, malformed or revoked."""
        if not _plausible(key):
            return None
        return self.lookup_hash(hash_key(key))

    def lookup_hash(self, digest: str) -> KeyRecord | None:
        """Like ``lookup`` for a key already hashed with ``hash_key``."""
        rows = self._rows(_SELECT_KEY, (digest[:KEY_ID_LEN],))
        if not rows or not hmac.compare_digest(str(rows[0][1]), digest):
            return None
        row = rows[0]
        if row[5] is not None:
            return None
        return KeyRecord(str(row[0]), str(row[2]), row[3], float(row[4]), None, _limits_row(tuple(row[6:])))

    def list(self, include_revoked: bool = False) -> builtins.list[KeyRecord]:
        """Every key (active ones only unless ``include_revoked``), oldest first."""
        sql = _SELECT_ALL if include_revoked else _SELECT_ALL + " WHERE revoked_at IS NULL"
        rows = self._rows(sql + " ORDER BY created_at, key_id", ())
        return [
            KeyRecord(str(r[0]), str(r[1]), r[2], float(r[3]), None if r[4] is None else float(r[4]))
            for r in rows
        ]

    def revoke(self, key_id: str) -> bool:
        """Revoke the key ``key_id``. False if there is no such active key."""
        if self._change(_REVOKE, (time.time(), key_id)) != 1:
            return False
        self._change(_BUMP, ())
        return True

    def set_limits(self, key_id: str, limits: KeyLimits, *, announce: bool = True) -> bool:
        """Replace the limits of the active key ``key_id``. False if there is no such key.
        ``announce``: move the change counter (replicas reload); False only for a key just
        created and not yet handed out (a replica reads its limits with its first lookup)."""
        for value in (limits.rpm, limits.tpm, limits.daily_usd, limits.monthly_usd):
            if value is not None and value <= 0:
                raise ValueError("limits must be positive (omit a limit to remove it)")
            if value is not None and not value <= MAX_LIMIT:  # NaN fails too
                raise ValueError(f"limits must be at most {MAX_LIMIT:,} (rpm, tpm, USD)")
        if not self._rows(_IS_ACTIVE, (key_id,)):
            return False
        self._change(
            _UPSERT_LIMITS,
            (
                key_id,
                limits.rpm,
                limits.tpm,
                None if limits.daily_usd is None else str(limits.daily_usd),
                None if limits.monthly_usd is None else str(limits.monthly_usd),
            ),
        )
        if announce:
            self._change(_BUMP, ())
        return True

    def version(self) -> int:
        """The store's change counter: it moves after every revoke and limits change."""
        rows = self._rows(_VERSION, ())
        return int(rows[0][0]) if rows else 0

    def all_limits(self) -> dict[str, KeyLimits]:
        """key_id -> limits, for every active key that has limits of its own."""
        return {str(r[0]): _limits_row(tuple(r[1:])) for r in self._rows(_SELECT_LIMITS, ())}


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class SharedConnectionStore(KeyStoreBase, Generic[C]):
    """A key store over one connection per process: opened lazily by ``_open()`` and shared by
    all threads under a lock (a lookup costs a few µs instead of the ~0.5 ms of opening a
    connection). A forked child, or a connection ``_usable()`` refuses, gets a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: C | None = None
        self._pid = 0

    @abstractmethod
    def _open(self) -> C:
        """A new connection, with the key tables in place."""

    def _usable(self, conn: C) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    @contextmanager
    def _connection(self) -> Iterator[C]:
        with self._lock:
            pid = os.getpid()
            if self._conn is None or self._pid != pid or not self._usable(self._conn):
                self._conn = self._open()  # a connection inherited over fork is not reused
                self._pid = pid
            yield self._conn


class KeyStore(SharedConnectionStore[sqlite3.Connection]):
    """Keys in a SQLite file (WAL; schema created on first use). Several processes may share
    the file; each process (also after a fork) opens its own connection."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(self.path),
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("BEGIN IMMEDIATE")
            for stmt in schema_sql("REAL"):
                conn.execute(stmt)
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        return conn

    def _rows(self, sql: str, params: tuple[object, ...]) -> builtins.list[tuple[Any, ...]]:
        with self._connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _change(self, sql: str, params: tuple[object, ...]) -> int:
        with self._connection() as conn:
            return conn.execute(sql, params).rowcount

    def _insert_new(self, sql: str, params: tuple[object, ...]) -> bool:
        try:
            self._change(sql, params)
        except sqlite3.IntegrityError:
            return False
        return True


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

    def lookup(self, key: str, ttl: float | None = None, stale: float | None = None) -> KeyRecord | None:
        """The active record for ``key`` (from memory when fresh), or None. ``ttl`` and
        ``stale`` override the cache's own for this lookup (the running policy's values)."""
        if not _plausible(key):
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
