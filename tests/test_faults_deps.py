"""Dependencies failing under a running gateway: its own Redis (started here on a free port,
never the shared one) paused with SIGSTOP, killed and restarted -> the exact cache degrades to
misses and recovers, no request fails or waits; the policy file corrupted during a reload
storm -> the last good policy keeps serving every request."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest

from load_tests.mock_upstream import MockUpstream
from load_tests.scenarios.deps import RedisProcess
from tests.conftest import service_unavailable
from tests.gateway_harness import ADMIN_KEY, RunningGateway, mock_policy, start_gateway


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private redis-server on a free port (the shared one is never paused or killed)."""
    if shutil.which("redis-server") is None:
        service_unavailable("redis-server (binary)", "not on PATH")
    r = RedisProcess(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": content}], **extra}


def timed(gw: RunningGateway, body: dict[str, object]) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = gw.post("/v1/chat/completions", body)
    return r, time.perf_counter() - t0


@pytest.mark.redis
def test_redis_paused_killed_and_back(tmp_path: Path, mock: MockUpstream, own_redis: RedisProcess) -> None:
    extra = f"cache: {{backend: redis, redis_url: '{own_redis.url}', redis_timeout_s: 0.05}}\n"
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra))
    sent = 0
    try:
        r, _ = timed(gw, chat("warm"))
        assert r.headers["x-switchyard-cache"] == "miss"
        time.sleep(0.1)  # the store is a background task
        r, _ = timed(gw, chat("warm"))
        assert r.headers["x-switchyard-cache"] == "hit"
        sent += 2

        # slow: Redis hangs (SIGSTOP) -> misses within the cache timeout, nothing fails
        own_redis.signal(signal.SIGSTOP)
        for i in range(5):
            r, seconds = timed(gw, chat("warm" if i == 0 else f"paused {i}"))
            assert r.status_code == 200 and r.headers["x-switchyard-cache"] == "miss"
            assert seconds < 0.5, f"request {i} waited {seconds:.3f} s on a hung Redis"
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: timed(gw, chat(f"burst {i}")), range(32)))
        assert all(r.status_code == 200 for r, _ in results)
        s = gw.post("/v1/chat/completions", chat("paused stream", stream=True))
        assert s.status_code == 200 and s.text.rstrip().endswith("data: [DONE]")
        sent += 5 + 32 + 1
        assert gw.get("/readyz").status_code == 503 and gw.get("/healthz").status_code == 200

        # back: after the cool-down the cache works again
        own_redis.signal(signal.SIGCONT)
        time.sleep(1.2)
        timed(gw, chat("after pause"))
        time.sleep(0.1)
        r, _ = timed(gw, chat("after pause"))
        assert r.headers["x-switchyard-cache"] == "hit"
        sent += 2

        # down: the server is gone (connection refused) -> misses, fast
        own_redis.stop()
        for i in range(5):
            r, seconds = timed(gw, chat(f"down {i}"))
            assert r.status_code == 200 and r.headers["x-switchyard-cache"] == "miss"
            assert seconds < 0.5
        sent += 5
        assert gw.app_state.services.cache.errors >= 2

        # restarted on the same port: recovers without a gateway restart
        own_redis.start()
        time.sleep(1.2)
        timed(gw, chat("restarted"))
        time.sleep(0.1)
        r, _ = timed(gw, chat("restarted"))
        assert r.headers["x-switchyard-cache"] == "hit"
        sent += 2
        assert gw.get("/readyz").status_code == 200

        rows = gw.ledger_rows()
        assert len(rows) == sent and {row["status"] for row in rows} == {"ok"}
    finally:
        gw.stop()


def _broken_variants(good: str) -> list[bytes]:
    return [
        good[: len(good) // 2].encode(),  # a half-written file
        b"",  # truncated to nothing
        b"\xff\xfe\x00garbage\x80\x81",  # not UTF-8
        good.replace("routes:", "routes:\n  broken: {targets: [nope]}", 1).encode(),  # dangling ref
        good.replace("providers:", "providers: [", 1).encode(),  # YAML syntax error
        (good + "\nbogus_top_level: 1\n").encode(),  # unknown key
    ]


def test_reload_storm_with_corrupted_files_never_drops_a_request(tmp_path: Path, mock: MockUpstream) -> None:
    good = mock_policy(mock.base_url)
    gw = start_gateway(tmp_path, good, policy_watch_s=0.02)
    stop = threading.Event()
    failures: list[str] = []
    served = [0]

    def traffic() -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not stop.is_set():
                i += 1
                r = client.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": "auto", "messages": [{"role": "user", "content": f"storm {i}"}]},
                    headers=gw.headers(),
                )
                served[0] += 1
                if r.status_code != 200:
                    failures.append(f"{r.status_code}: {r.text[:200]}")

    def admin_reload() -> int:
        with httpx.Client(timeout=10) as client:
            r = client.post(gw.url + "/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
            return r.status_code

    gw.key()
    workers = [threading.Thread(target=traffic, daemon=True) for _ in range(3)]
    for w in workers:
        w.start()
    statuses: set[int] = set()
    try:
        variants = _broken_variants(good)
        for rnd in range(6):
            for bad in variants:
                gw.policy_path.write_bytes(bad)  # in place, not atomic: the watcher may see it torn
                statuses.add(admin_reload())
                time.sleep(0.01)
            gw.policy_path.write_text(good if rnd % 2 else good.replace("retries: 1", "retries: 0", 1))
            statuses.add(admin_reload())
        gw.policy_path.write_bytes(variants[0])  # the storm ends on a corrupted file
        statuses.add(admin_reload())
        time.sleep(0.2)
    finally:
        stop.set()
        for w in workers:
            w.join(15)
    try:
        assert not failures, failures[:5]
        assert served[0] >= 20
        assert statuses == {200, 422}
        r = gw.post(
            "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": "after"}]}
        )
        assert r.status_code == 200
        assert gw.app_state.services.policy.routes["auto"].retries == 1  # the last good one
        metrics = gw.get("/metrics").text
        assert 'switchyard_policy_reloads_total{result="error"}' in metrics
        assert 'switchyard_policy_reloads_total{result="ok"}' in metrics
        rows = gw.ledger_rows()
        assert len(rows) == served[0] + 1 and {row["status"] for row in rows} == {"ok"}
    finally:
        gw.stop()
