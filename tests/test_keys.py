"""Virtual keys: hash-only storage, lookup, revocation, the in-memory cache."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.limits.key_cache import KeyCache
from gateway.limits.keys import KEY_PREFIX, KeyRecord, KeyStore, validate_tenant


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(KeyStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0

    def lookup_hash(self, digest: str) -> KeyRecord | None:
        self.reads += 1
        return super().lookup_hash(digest)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyStore]:
    with KeyStore(tmp_path / "home" / "keys.db") as s:
        yield s


def db_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_create_and_lookup(store: KeyStore) -> None:
    key, rec = store.create("acme", name="ci")
    assert re.fullmatch(r"sk-sy-[A-Za-z0-9_-]{43}", key)
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert rec.key_id == digest[:12]
    assert (rec.tenant, rec.name, rec.revoked_at) == ("acme", "ci", None)
    assert store.lookup(key) == rec
    assert store.lookup(key + "x") is None
    assert store.lookup("sk-sy-" + "A" * 43) is None
    assert store.lookup("not-a-key") is None
    assert store.lookup(KEY_PREFIX + "x" * 10_000) is None


def test_db_holds_only_hashes(store: KeyStore) -> None:
    keys = [store.create("acme")[0] for _ in range(5)]
    for key in keys:
        assert store.lookup(key) is not None
    raw = db_bytes(store.path)
    assert raw
    for key in keys:
        secret = key.encode()
        assert secret not in raw
        assert secret[len(KEY_PREFIX) :] not in raw
        assert hashlib.sha256(secret).hexdigest().encode() in raw  # we did read the right bytes


def test_record_repr_has_no_secret(store: KeyStore) -> None:
    key, rec = store.create("acme")
    digest = hashlib.sha256(key.encode()).hexdigest()
    text = repr(rec) + str(rec)
    assert key not in text
    assert digest not in text
    assert rec.key_id in text


def test_revoke(store: KeyStore) -> None:
    key, rec = store.create("acme")
    other, _ = store.create("beta")
    assert store.revoke(rec.key_id)
    assert not store.revoke(rec.key_id)  # already revoked
    assert not store.revoke("ffffffffffff")
    assert store.lookup(key) is None
    assert store.lookup(other) is not None
    active = store.list()
    assert [r.tenant for r in active] == ["beta"]
    everything = store.list(include_revoked=True)
    assert len(everything) == 2
    revoked = next(r for r in everything if r.key_id == rec.key_id)
    assert revoked.revoked and revoked.revoked_at is not None


@pytest.mark.parametrize("tenant", ["", "-acme", "a" * 65, "ac me", "acme/x", "ünï", "a\n"])
def test_bad_tenants(store: KeyStore, tenant: str) -> None:
    with pytest.raises(ValueError, match="invalid tenant"):
        store.create(tenant)


@pytest.mark.parametrize("tenant", ["a", "A9", "team-1.prod_x", "9" + "z" * 63])
def test_good_tenants(tenant: str) -> None:
    assert validate_tenant(tenant) == tenant


def test_bad_name(store: KeyStore) -> None:
    with pytest.raises(ValueError):
        store.create("acme", name="x\x00y")


def test_shared_by_two_store_objects(tmp_path: Path) -> None:
    with KeyStore(tmp_path / "keys.db") as a, KeyStore(tmp_path / "keys.db") as b:
        key, rec = a.create("acme")
        assert a.lookup(key) == rec
        assert b.lookup(key) == rec
        assert b.revoke(rec.key_id)
        assert a.lookup(key) is None  # the other connection's commit is seen at once
    with KeyStore(tmp_path / "keys.db") as c:
        assert len(c.list(include_revoked=True)) == 1


def test_cache_serves_from_memory_until_ttl(tmp_path: Path) -> None:
    with CountingStore(tmp_path / "keys.db") as store:
        _check_ttl(store)


def _check_ttl(store: CountingStore) -> None:
    clock = FakeClock()
    cache = KeyCache(store, ttl=5.0, negative_ttl=1.0, clock=clock)
    key, rec = store.create("acme")
    for _ in range(100):
        assert cache.lookup(key) == rec
    assert store.reads == 1
    store.revoke(rec.key_id)
    clock.now += 4.9
    assert cache.lookup(key) == rec  # still cached: revocation visible within ttl
    clock.now += 0.2
    assert cache.lookup(key) is None
    assert store.reads == 2


def test_negative_cache_ttl_and_bound(tmp_path: Path) -> None:
    with CountingStore(tmp_path / "keys.db") as store:
        _check_negative(store)


def _check_negative(store: CountingStore) -> None:
    clock = FakeClock()
    cache = KeyCache(store, ttl=5.0, negative_ttl=1.0, max_negative=50, clock=clock)
    bad = "sk-sy-" + "B" * 43
    for _ in range(10):
        assert cache.lookup(bad) is None
    assert store.reads == 1
    clock.now += 1.5
    assert cache.lookup(bad) is None
    assert store.reads == 2
    for i in range(1000):
        assert cache.lookup(f"sk-sy-random{i}") is None
    assert cache.sizes() == (0, 50)
    assert cache.lookup("garbage") is None  # not key-shaped: no read, no entry
    assert store.reads == 1002
    cache.clear()
    assert cache.sizes() == (0, 0)


def test_key_created_after_negative_entry_is_found_after_negative_ttl(store: KeyStore) -> None:
    clock = FakeClock()
    cache = KeyCache(store, negative_ttl=1.0, clock=clock)
    key, rec = store.create("acme")
    store.revoke(rec.key_id)
    assert cache.lookup(key) is None
    with sqlite3.connect(str(store.path)) as conn:  # un-revoke behind the cache's back
        conn.execute("UPDATE api_keys SET revoked_at = NULL")
    conn.close()
    assert cache.lookup(key) is None
    clock.now += 1.01
    assert cache.lookup(key) == rec
