"""Virtual keys in PostgreSQL (shared by gateway replicas) against the real PostgreSQL server.

Each test works in its own schema (selected with ``options=-csearch_path=...`` in the URL),
dropped afterwards. The replica test runs two real ``switchyard serve`` processes on one
PostgreSQL ledger URL."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import httpx2 as httpx
import pytest

from gateway.config.settings import Settings
from gateway.ledger.pg import pg_connect
from gateway.limits.key_cache import KeyCache
from gateway.limits.keys import KeyLimits, KeyStore, hash_key
from gateway.limits.keys_pg import PostgresKeyStore
from gateway.limits.stores import open_key_store
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, free_port, mock_policy
from tests.pg_support import scratch_schema

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parent.parent
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def pg_url() -> Iterator[str]:
    with scratch_schema("sy_keys") as url:
        yield url


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresKeyStore]:
    with PostgresKeyStore(pg_url) as s:
        yield s


def columns(url: str, table: str) -> list[str]:
    with pg_connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
    return [str(r[0]) for r in rows]


# ----------------------------------------------------------------------------- store API
def test_tables_match_the_sqlite_store(store: PostgresKeyStore, pg_url: str, tmp_path: Path) -> None:
    store.list()  # the first call creates the tables
    with KeyStore(tmp_path / "keys.db") as lite:
        lite.list()
        with lite._connection() as c:
            for table in ("api_keys", "key_limits"):
                lite_cols = [str(r[1]) for r in c.execute(f"PRAGMA table_info({table})")]
                assert columns(pg_url, table) == lite_cols


def test_create_lookup_and_only_the_hash_is_stored(store: PostgresKeyStore, pg_url: str) -> None:
    key, rec = store.create("acme", "ci")
    assert key.startswith("sk-sy-") and rec.tenant == "acme" and rec.name == "ci"
    assert rec.key_id == hash_key(key)[:12] and not rec.revoked
    assert store.lookup(key) == rec
    assert store.lookup_hash(hash_key(key)) == rec
    assert store.lookup(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.lookup("not-a-key") is None and store.lookup("sk-sy-" + "x" * 300) is None
    # a digest whose key_id matches but whose remainder does not is refused (constant-time compare)
    assert store.lookup_hash(hash_key(key)[:12] + "0" * 52) is None
    with pg_connect(pg_url) as conn:
        dump = repr(conn.execute("SELECT * FROM api_keys").fetchall())
    assert key not in dump and key[6:] not in dump and hash_key(key) in dump


def test_validation(store: PostgresKeyStore) -> None:
    with pytest.raises(ValueError, match="invalid tenant"):
        store.create("-bad")
    with pytest.raises(ValueError, match="invalid key name"):
        store.create("acme", "x" * 201)
    key_id = store.create("acme")[1].key_id
    with pytest.raises(ValueError, match="positive"):
        store.set_limits(key_id, KeyLimits(rpm=0))
    assert store.list()[0].tenant == "acme" and len(store.list()) == 1


def test_list_revoke_and_limits(store: PostgresKeyStore) -> None:
    k1, r1 = store.create("a", "one")
    _, r2 = store.create("b")
    assert [r.key_id for r in store.list()] == [r1.key_id, r2.key_id]
    assert store.set_limits(r1.key_id, KeyLimits(rpm=10, daily_usd=Decimal("1.50")))
    assert store.set_limits(r2.key_id, KeyLimits(tpm=5))
    assert store.set_limits(r2.key_id, KeyLimits(monthly_usd=Decimal("0.0000000001")))  # replaced
    assert store.all_limits() == {
        r1.key_id: KeyLimits(rpm=10, daily_usd=Decimal("1.50")),
        r2.key_id: KeyLimits(monthly_usd=Decimal("0.0000000001")),
    }
    assert not store.set_limits("nope", KeyLimits(rpm=1))
    assert store.revoke(r1.key_id)
    assert not store.revoke(r1.key_id) and not store.revoke("nope")
    assert store.lookup(k1) is None
    assert [r.key_id for r in store.list()] == [r2.key_id]
    everything = store.list(include_revoked=True)
    assert [r.key_id for r in everything] == [r1.key_id, r2.key_id]
    assert everything[0].revoked_at is not None and everything[0].revoked_at >= r1.created_at
    assert not store.set_limits(r1.key_id, KeyLimits(rpm=1))
    assert set(store.all_limits()) == {r2.key_id}


def test_key_id_collision_draws_again(store: PostgresKeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter(["same" * 8, "same" * 8, "other" * 8])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(draws))
    first, _ = store.create("a")
    second, _ = store.create("a")  # the second draw collides in PostgreSQL: a third is taken
    assert first == "sk-sy-" + "same" * 8 and second == "sk-sy-" + "other" * 8
    assert store.lookup(second) is not None


def test_two_stores_share_keys_close_and_reopen(pg_url: str) -> None:
    a, b = PostgresKeyStore(pg_url), PostgresKeyStore(pg_url)
    with a, b:
        key, rec = a.create("shared")
        assert b.lookup(key) == rec
        assert b.set_limits(rec.key_id, KeyLimits(rpm=3))
        assert a.all_limits() == {rec.key_id: KeyLimits(rpm=3)}
        cache = KeyCache(b, ttl=0.3)
        assert cache.lookup(key) == rec
        assert a.revoke(rec.key_id)
        assert cache.lookup(key) == rec  # still cached on the other "replica"
        time.sleep(0.35)
        assert cache.lookup(key) is None  # gone once the TTL has run out
    assert a._conn is None
    assert a.list(include_revoked=True)[0].key_id == rec.key_id  # a closed store reopens
    a.close()


def test_an_unreachable_store_keeps_confirmed_keys_and_fails_fast_for_others(pg_url: str) -> None:
    """PostgreSQL down: keys confirmed before keep working past the cache TTL (the ledger has
    its outbox, so requests still succeed); unknown keys get a clean 503, quickly."""
    from gateway.api.auth import authenticate
    from gateway.config.policy import Policy
    from gateway.core.errors import ServiceUnavailableError

    with PostgresKeyStore(pg_url) as a:
        key, rec = a.create("outage")
    b = PostgresKeyStore(pg_url)
    cache = KeyCache(b, ttl=0.2)
    assert cache.lookup(key) == rec
    b.close()
    b.url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"  # the server is gone
    time.sleep(0.25)  # past the TTL: the cache must ask the store, which fails
    assert cache.lookup(key) == rec
    headers = {"authorization": f"Bearer {key[:-4]}zzzz"}  # a key never seen: nothing to fall back on
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(ServiceUnavailableError) as err:
            authenticate(headers, Policy(), cache)  # type: ignore[arg-type]
        assert err.value.status == 503 and err.value.code == "key_store_unavailable"
    assert time.monotonic() - t0 < 4.0  # one connect attempt, then fail fast (no 2 s wait each)
    b.close()


def test_open_key_store_picks_the_backend(tmp_path: Path, pg_url: str) -> None:
    lite = Settings(
        tmp_path / "lite", tmp_path / "p.yaml", None, f"sqlite:///{tmp_path / 'l.db'}", None, "info"
    )
    with open_key_store(lite) as s:
        assert isinstance(s, KeyStore) and s.path == tmp_path / "lite" / "keys.db"
        s.list()
    pg = replace(lite, home=tmp_path / "pg", ledger_url=pg_url)
    with open_key_store(pg) as s:
        assert isinstance(s, PostgresKeyStore)
        key, _ = s.create("x")
    with PostgresKeyStore(pg_url) as other:
        assert other.lookup(key) is not None
    assert (tmp_path / "lite" / "keys.db").exists() and not (tmp_path / "pg" / "keys.db").exists()


def test_cli_reports_an_unreachable_database(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SWITCHYARD_HOME": str(tmp_path),
        "SWITCHYARD_LEDGER": f"postgresql://postgres@127.0.0.1:{free_port()}/test",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "list"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("switchyard: error: key store: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "keys.db").exists()


# ----------------------------------------------------------------------------- two replicas
def _env(home: Path, ledger: str) -> dict[str, str]:
    drop = (
        "SWITCHYARD_POLICY",
        "SWITCHYARD_REDIS_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENAI_BASE_URL",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(SWITCHYARD_HOME=str(home), SWITCHYARD_LEDGER=ledger, SWITCHYARD_ADMIN_KEY=ADMIN_KEY)
    return env | {"PYTHONUNBUFFERED": "1"}


def _serve(tmp: Path, name: str, ledger: str, policy: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port, log = free_port(), tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--policy", str(policy), "--log-level", "warning"],
            env=_env(tmp / name, ledger), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}", log


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"switchyard serve exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"switchyard serve not ready within 60 s:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)


@pytest.fixture
def replicas(tmp_path: Path, pg_url: str, mock: MockUpstream) -> Iterator[tuple[str, str]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(mock_policy(mock.base_url))
    procs = [_serve(tmp_path, name, pg_url, policy) for name in ("a", "b")]
    try:
        for proc, url, log in procs:
            _wait_ready(proc, url, log)
        yield procs[0][1], procs[1][1]
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _, _ in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _chat(url: str, key: str) -> int:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "auto", "messages": HI},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    return r.status_code


def test_two_gateways_share_keys_and_revocations(
    replicas: tuple[str, str], pg_url: str, tmp_path: Path
) -> None:
    a, b = replicas
    # a key made with the CLI (a third process, same ledger URL) works on both replicas
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "create", "--tenant", "team-a"],
        env=_env(tmp_path / "cli", pg_url), cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (cli_key,) = re.findall(r"sk-sy-[A-Za-z0-9_\-]+", proc.stdout)
    assert _chat(a, cli_key) == 200 and _chat(b, cli_key) == 200
    # a key made through replica A's admin API is accepted by replica B and listed there
    r = httpx.post(a + "/admin/keys", json={"tenant": "team-a", "name": "from-a"}, headers=ADMIN, timeout=10)
    assert r.status_code in (200, 201), r.text
    api_key, key_id = r.json()["key"], r.json()["key_id"]
    assert _chat(b, api_key) == 200  # B now caches it as valid
    listed = httpx.get(b + "/admin/keys", headers=ADMIN, timeout=10).json()["keys"]
    assert key_id in {k["key_id"] for k in listed}
    # revoked on A: A refuses at once, B within its key cache TTL (5 s)
    assert httpx.delete(a + f"/admin/keys/{key_id}", headers=ADMIN, timeout=10).status_code == 200
    revoked_at = time.monotonic()
    assert _chat(a, api_key) == 401
    while _chat(b, api_key) != 401:
        assert time.monotonic() - revoked_at < 5.0 + 2.0, "replica B still accepts a key revoked on A"
        time.sleep(0.2)
    assert _chat(b, cli_key) == 200  # the other key is untouched
    # and nothing was written to the per-instance SQLite key files
    assert not (tmp_path / "a" / "keys.db").exists() and not (tmp_path / "b" / "keys.db").exists()
    assert not (tmp_path / "cli" / "keys.db").exists()


# ----------------------------------------------------------------------------- outage (issue 14)
def test_a_key_revoked_just_before_an_outage_stops_within_the_grace_bound(
    tmp_path: Path, pg_url: str, mock: MockUpstream
) -> None:
    """PostgreSQL goes away right after a key is revoked elsewhere (another replica, the CLI):
    this gateway cannot see the revoke, so the key works for at most key_cache_ttl_s +
    key_outage_grace_s after its last confirmation, then 503; a key it never saw gets 503 at
    once; after the outage the revoked key is refused (401) and the other works again."""
    from tests.pg_outage import CuttableProxy

    ttl, grace = 0.5, 2.0
    proxy = CuttableProxy(("127.0.0.1", 5432), pg_url)
    assert proxy.url != pg_url, "the proxy must stand between the gateway and PostgreSQL"
    proxy.start()
    with PostgresKeyStore(pg_url) as direct:  # a path to PostgreSQL that the outage does not cut
        revoked_key, revoked = direct.create("team-a")
        kept_key, _ = direct.create("team-a")
        unseen_key, _ = direct.create("team-a")
        policy = tmp_path / "policy.yaml"
        extra = f"server: {{key_cache_ttl_s: {ttl}, key_outage_grace_s: {grace}}}\n"
        policy.write_text(mock_policy(mock.base_url, extra))
        proc, url, log = _serve(tmp_path, "gw", proxy.url, policy)
        try:
            _wait_ready(proc, url, log)
            assert _chat(url, revoked_key) == 200 and _chat(url, kept_key) == 200
            confirmed = time.monotonic()  # (at the latest)
            assert direct.revoke(revoked.key_id)
            proxy.crash()  # PostgreSQL unreachable from the gateway from now on
            assert _chat(url, unseen_key) == 503  # nothing confirmed: no grace
            codes: list[tuple[float, int]] = []
            while time.monotonic() - confirmed < ttl + grace + 1.5:
                codes.append((time.monotonic() - confirmed, _chat(url, revoked_key)))
                time.sleep(0.1)
            late = [code for t, code in codes if t > ttl + grace + 0.3]
            assert late and set(late) == {503}, codes  # the revoked key stopped working mid-outage
            assert {code for _, code in codes} <= {200, 503}, codes
            assert _chat(url, kept_key) == 503  # a valid key too: no one is confirmed any more
            proxy.start()  # PostgreSQL is back
            deadline = time.monotonic() + 10
            while _chat(url, kept_key) != 200:
                assert time.monotonic() < deadline, "the gateway did not reconnect to PostgreSQL"
                time.sleep(0.2)
            assert _chat(url, revoked_key) == 401
        finally:
            proxy.destroy()
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
