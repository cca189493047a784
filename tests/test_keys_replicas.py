"""Key changes made on one replica (or by the CLI, writing the store directly) reach the
others within a second, and a key is never admitted without its own limits.

Each "replica" here is what a gateway process holds: its own store connection, KeyCache,
Limits and KeyWatch, over one shared store (a SQLite file, as worker processes share it, and
a PostgreSQL schema, as replicas share it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.flow.services import TaskOwner
from gateway.limits.gate import Limits
from gateway.limits.key_cache import KeyCache
from gateway.limits.key_watch import KeyWatch
from gateway.limits.keys import KeyLimits, KeyStore, KeyStoreBase
from gateway.limits.keys_pg import PostgresKeyStore
from tests.pg_support import scratch_schema

LIMITS = KeyLimits(rpm=5, daily_usd=Decimal("0.05"))


@dataclass
class Replica:
    store: KeyStoreBase
    keys: KeyCache
    limits: Limits
    watch: KeyWatch


def replica(store: KeyStoreBase) -> Replica:
    limits = Limits(key_limits=store.all_limits, spawn=TaskOwner().spawn)
    limits.refresh_key_limits()
    keys = KeyCache(store, ttl=60.0, on_record=lambda rec: limits.learn(rec.key_id, rec.limits))
    return Replica(store, keys, limits, KeyWatch(store, keys, limits, interval_s=0.05))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[KeyStoreBase]]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            made: list[KeyStoreBase] = [KeyStore(tmp_path / "keys.db") for _ in range(3)]
        else:
            url = stack.enter_context(scratch_schema("sy_keyrep"))
            made = [PostgresKeyStore(url) for _ in range(3)]
        for s in made:
            stack.callback(s.close)
        yield made


def test_a_key_made_elsewhere_is_admitted_with_its_limits_at_once(stores: list[KeyStoreBase]) -> None:
    a, b = replica(stores[0]), replica(stores[1])
    key, rec = a.store.create("acme")
    a.store.set_limits(rec.key_id, LIMITS)
    # replica b loaded every key's limits before the key existed; its first lookup reads them
    found = b.keys.lookup(key)
    assert found is not None and found.limits == LIMITS
    assert b.limits.key_limits(rec.key_id) == LIMITS


def _policy():  # type: ignore[no-untyped-def]
    from gateway.config.policy import Policy

    return Policy.model_validate({"providers": {}, "routes": {}})


def test_revoke_and_limits_changes_reach_every_replica_within_a_second(stores: list[KeyStoreBase]) -> None:
    a, b = replica(stores[0]), replica(stores[1])
    cli = stores[2]  # the CLI writes the store directly; no gateway hears about it

    async def scenario() -> None:
        watcher = asyncio.get_running_loop().create_task(b.watch.run())
        try:
            key, rec = a.store.create("acme")
            assert b.keys.lookup(key) is not None  # cached on b now (ttl 60 s)
            assert b.limits.key_limits(rec.key_id) == KeyLimits()

            await _within(1.0, lambda: b.watch.version is not None)
            cli.set_limits(rec.key_id, LIMITS)
            await _within(1.0, lambda: b.limits.key_limits(rec.key_id) == LIMITS)

            a.store.set_limits(rec.key_id, KeyLimits(rpm=1))
            await _within(1.0, lambda: b.limits.key_limits(rec.key_id) == KeyLimits(rpm=1))

            assert b.keys.lookup(key) is not None  # cached again
            seen = b.watch.changes
            assert cli.revoke(rec.key_id)
            await _within(1.0, lambda: b.keys.lookup(key) is None)
            assert b.watch.changes == seen + 1  # the watch dropped it, not the cache's TTL
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    asyncio.run(scenario())


async def _within(seconds: float, cond: object) -> None:
    assert callable(cond)
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not true within {seconds} s"
        await asyncio.sleep(0.02)


def test_an_unreachable_store_refuses_an_unknown_key_never_admits_it_unlimited() -> None:
    from gateway.api.auth import authenticate
    from gateway.core.errors import ServiceUnavailableError

    policy = _policy()
    dead = PostgresKeyStore("postgresql://postgres@127.0.0.1:1/none")
    keys = KeyCache(dead)
    with pytest.raises(ServiceUnavailableError) as err:
        authenticate({"authorization": "Bearer sk-sy-" + "x" * 43}, policy, keys)
    assert err.value.status == 503
    dead.close()


def test_only_changes_to_keys_in_use_move_the_counter(stores: list[KeyStoreBase]) -> None:
    """A new key is in no replica's cache: making one (with its limits, before it is handed
    out) leaves every replica's cached keys alone; a limits change or revoke does not."""
    store = stores[0]
    before = store.version()
    _, rec = store.create("acme")
    assert store.set_limits(rec.key_id, LIMITS, announce=False)
    assert store.version() == before
    assert store.set_limits(rec.key_id, KeyLimits(rpm=9))
    assert store.version() == before + 1
    assert store.revoke(rec.key_id) and store.version() == before + 2
    assert not store.revoke(rec.key_id) and store.version() == before + 2  # nothing changed


def test_a_watched_replica_never_reloads_limits_on_the_event_loop(stores: list[KeyStoreBase]) -> None:
    """The watch reads the counter and (when it moves) every key's limits in a thread; while
    it runs, the limits' periodic reload, a query on the loop, is not needed and never runs."""
    import threading

    store = stores[0]
    _, rec = store.create("acme")
    store.set_limits(rec.key_id, LIMITS)
    loads: list[str] = []

    def load() -> dict[str, KeyLimits]:
        loads.append(threading.current_thread().name)
        return store.all_limits()

    limits = Limits(key_limits=load, spawn=TaskOwner().spawn)
    watch = KeyWatch(store, KeyCache(store, ttl=60.0), limits, interval_s=0.05)

    async def scenario() -> None:
        loop_thread = threading.current_thread().name
        await watch.check()  # the first read loads every key's limits, off the loop
        assert limits.key_limits(rec.key_id) == LIMITS
        limits._key_limits_at -= 10  # as if the periodic reload were due ...
        await watch.check()  # ... the watch saw no change: the limits are confirmed current
        assert limits.key_limits(rec.key_id) == LIMITS
        assert loop_thread not in loads

    asyncio.run(scenario())
