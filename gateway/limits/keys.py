"""Virtual API keys, stored only as SHA-256 hashes (the in-memory lookup cache in front of a
store: limits/key_cache.py).

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
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
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


def plausible(key: object) -> bool:
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
        if not plausible(key):
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
