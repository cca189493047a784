"""Prefix fingerprints, consistent hashing with bounded load, the vLLM /metrics parser, the
saturation rules and spill-over ordering (pure logic; the real engine is in test_engine_vllm)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.config.loader import PolicyError, parse_policy
from gateway.config.policy import EngineLoadPolicy, Policy
from gateway.core.types import Price, Principal, Target
from gateway.routing.balancer import HashRing, ReplicaBalancer, prefix_fingerprint
from gateway.routing.engine_load import (
    SLOW,
    SLOW_DOWN_AFTER,
    EngineBoard,
    ReplicaSample,
    ReplicaState,
    _scrape,
    parse_vllm_metrics,
)
from gateway.routing.router import Router
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, free_port, start_gateway

SHARED = "You are a support agent for ACME. " * 40  # ~1,400 characters of shared context


def chat(system: str, user: str) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def test_fingerprint_keys_on_the_leading_blocks_only() -> None:
    a = prefix_fingerprint(chat(SHARED, "question one"), 1024)
    b = prefix_fingerprint(chat(SHARED, "a completely different question"), 1024)
    c = prefix_fingerprint(chat("Other system prompt. " + SHARED, "question one"), 1024)
    assert a is not None and a == b and a != c
    assert prefix_fingerprint(chat("short", "hi"), 1024) is None  # nothing worth keeping together
    parts = {"messages": [{"role": "system", "content": [{"type": "text", "text": SHARED}]}]}
    assert prefix_fingerprint(parts, 1024) == prefix_fingerprint(
        {"messages": [{"role": "system", "content": SHARED}]}, 1024
    )
    assert prefix_fingerprint({"prompt": SHARED}, 64) is not None
    assert prefix_fingerprint({"messages": "nope"}, 16) is None


def test_ring_spreads_keys_and_moves_few_when_a_replica_is_added() -> None:
    urls = [f"http://10.0.0.{i}:8000/v1" for i in range(4)]
    ring4, ring5 = HashRing(urls), HashRing([*urls, "http://10.0.0.9:8000/v1"])
    keys = [hash(("k", i)) & (2**64 - 1) for i in range(4000)]
    owners = Counter(ring4.walk(k)[0] for k in keys)
    assert min(owners.values()) > 600  # each of 4 replicas gets a fair share (1,000 expected)
    moved = sum(ring4.walk(k)[0] != ring5.walk(k)[0] for k in keys)
    assert moved < 4000 * 0.3  # ~1/5 move to the new replica, not a reshuffle
    assert sorted(ring4.walk(keys[0])) == [0, 1, 2, 3]


def test_affinity_sticks_until_the_bound_then_overflows() -> None:
    bal = ReplicaBalancer(
        ["http://a/v1", "http://b/v1"], "prefix_affinity", prefix_chars=256, load_factor=1.5
    )
    body = chat(SHARED, "q")
    home = bal.order(body)[0]
    assert all(bal.order(chat(SHARED, f"q{i}"))[0] == home for i in range(20))
    # in flight: the home replica takes requests while it stays within ceil(1.5 x mean)
    placed = []
    for _ in range(8):
        i = bal.order(body)[0]
        bal.acquire(i)
        placed.append(i)
        assert max(bal.in_flight) <= math.ceil(1.5 * sum(bal.in_flight) / 2)
    assert placed[:3] == [home] * 3 and placed[3] == 1 - home  # the bound spills the 4th
    assert placed.count(home) > placed.count(1 - home) > 0
    for i in placed:
        bal.release(i, True)
    assert bal.in_flight == [0, 0]


def test_round_robin_and_least_loaded() -> None:
    rr = ReplicaBalancer(["http://a/v1", "http://b/v1", "http://c/v1"], "round_robin")
    assert [rr.order(chat(SHARED, "x"))[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    ll = ReplicaBalancer(["http://a/v1", "http://b/v1"], "least_loaded")
    ll.acquire(0)
    assert ll.order(chat(SHARED, "x")) == [1, 0]
    short = ReplicaBalancer(["http://a/v1", "http://b/v1"], "prefix_affinity")
    short.acquire(1)
    assert short.order(chat("hi", "there"))[0] == 0  # no fingerprint: least loaded


def test_dead_and_saturated_replicas_go_last() -> None:
    down = {"http://b/v1"}
    bal = ReplicaBalancer(["http://a/v1", "http://b/v1"], "round_robin", available=lambda u: u not in down,
                          failure_threshold=2)  # fmt: skip
    assert [bal.order({})[0] for _ in range(3)] == [0, 0, 0]
    assert bal.order({}) == [0, 1]
    down.clear()
    for _ in range(2):
        bal.acquire(0)
        bal.release(0, False)  # transport failures open replica 0's breaker
    assert bal.breakers[0].state == "open"
    assert [bal.order({})[0] for _ in range(3)] == [1, 1, 1]


METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1024.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 256.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 1.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 10.0
vllm:gpu_cache_usage_perc{engine="0",model_name="tiny"} 0.99
"""


def test_parse_vllm_metrics_and_interval_deltas() -> None:
    s = parse_vllm_metrics(METRICS)
    assert s == ReplicaSample(3.0, 2.0, 0.25, 1024.0, 256.0, 1.5, 10.0)
    r = ReplicaState("http://127.0.0.1:8001/v1")
    assert r.metrics_url == "http://127.0.0.1:8001/metrics" and r.label == "127.0.0.1:8001"
    r.observe(s, 1.0)
    assert r.hit_ratio is None and r.ttft_s is None  # one sample: no interval yet
    r.observe(
        dataclasses.replace(s, prefix_queries=2048.0, prefix_hits=1024.0, ttft_sum=2.5, ttft_count=12.0), 2.0
    )
    assert r.hit_ratio == 0.75 and r.ttft_s == 0.5
    r.observe(dataclasses.replace(s, prefix_queries=10.0, prefix_hits=0.0), 3.0)  # restarted: reset
    assert r.hit_ratio == 0.75
    r.observe(None, 4.0)
    assert r.up is False and r.values()["up"] == 0.0 and r.values()["queue_depth"] is None


def target(model: str, provider: str) -> Target:
    return Target(model, provider, model, Price(Decimal(0), Decimal(0)))


def test_spill_moves_a_saturated_engine_behind_the_next_target() -> None:
    policy = Policy.model_validate(
        {
            "providers": {
                "vllm": {"type": "openai", "base_url": "http://127.0.0.1:1/v1", "key_required": False,
                         "self_hosted": True, "load": {"max_waiting": 2, "max_kv_usage": 0.9}},
                "api": {"type": "openai", "base_url": "http://127.0.0.1:2/v1", "key_required": False},
            },
            "models": {"local": {"provider": "vllm", "price": {"input": 0, "output": 0}},
                       "remote": {"provider": "api", "price": {"input": 1, "output": 2}}},
            "routes": {"auto": {"targets": ["local", "remote"]}},
        }
    )  # fmt: skip
    board = EngineBoard()
    board.configure(policy)
    plan = Router(policy).plan("auto", Principal("t"), "chat")
    spills: list[tuple[str, str]] = []
    count = lambda e, r: spills.append((e, r))  # noqa: E731
    assert board.spill(plan, count) is plan  # never probed: room assumed
    replica = board.engines["vllm"].replicas[0]
    replica.observe(ReplicaSample(waiting=5.0, running=8.0, kv_usage=0.5), 1.0)
    assert [t.model for t in board.spill(plan, count).targets] == ["remote", "local"]
    assert spills == [("vllm", "queue")]
    replica.observe(ReplicaSample(waiting=0.0, running=8.0, kv_usage=0.95), 2.0)
    board.spill(plan, count)
    assert spills[-1] == ("vllm", "kv_cache")
    replica.observe(ReplicaSample(waiting=0.0, running=1.0, kv_usage=0.1), 3.0)
    assert board.spill(plan, count).targets == plan.targets  # recovered: back first
    replica.observe(None, 4.0)
    board.spill(plan, count)
    assert spills[-1] == ("vllm", "down") and len(spills) == 3
    # a reload keeps the probe state of replicas that stay
    board.configure(policy)
    assert board.engines["vllm"].replicas[0] is replica


def test_ttft_slo_saturates() -> None:
    load = EngineLoadPolicy(ttft_slo_s=0.5)
    r = ReplicaState("http://x/v1")
    r.observe(ReplicaSample(ttft_sum=1.0, ttft_count=10.0), 1.0)
    r.observe(ReplicaSample(ttft_sum=9.0, ttft_count=20.0), 2.0)
    assert r.ttft_s == 0.8 and r.saturation(load) == "ttft"


def test_engine_is_saturated_only_when_every_replica_is() -> None:
    policy = Policy.model_validate({"providers": {"vllm": {
        "type": "openai", "base_url": "http://a/v1", "replicas": ["http://a/v1", "http://b/v1"],
        "key_required": False, "load": {"max_waiting": 0}}}})  # fmt: skip
    board = EngineBoard()
    board.configure(policy)
    a, b = board.engines["vllm"].replicas
    a.observe(ReplicaSample(waiting=4.0), 1.0)
    assert board.engines["vllm"].saturation() is None
    assert not board.replica_available("vllm", "http://a/v1") and board.replica_available(
        "vllm", "http://b/v1"
    )
    b.observe(None, 1.0)
    assert board.engines["vllm"].saturation() == "queue"


def test_policy_validates_engine_fields() -> None:
    base = "models: {}\nproviders:\n  vllm: {type: %s, base_url: 'http://a/v1', key_required: false, %s}\n"
    with pytest.raises(PolicyError) as err:
        parse_policy(
            base % ("openai", "replicas: ['ftp://x', 'http://a/v1'], load: {max_kv_usage: 1.5, bogus: 1}")
        )
    paths = {p for p, _ in err.value.problems}
    assert {
        "providers.vllm.replicas",
        "providers.vllm.load.max_kv_usage",
        "providers.vllm.load.bogus",
    } <= paths
    with pytest.raises(PolicyError, match="replicas/load are for OpenAI-compatible engines"):
        parse_policy(base % ("anthropic", "load: {max_waiting: 3}"))
    with pytest.raises(PolicyError, match="replicas must be distinct"):
        parse_policy(base % ("openai", "replicas: ['http://a/v1', 'http://a/v1/']"))
    ok = parse_policy(base % ("openai", "replicas: ['http://a/v1/', 'http://b/v1'], balance: round_robin"))
    prov = ok.providers["vllm"]
    assert prov.replica_urls == ["http://a/v1", "http://b/v1"] and prov.load is None
    assert parse_policy(base % ("openai", "self_hosted: false")).providers["vllm"].replica_urls == [
        "http://a/v1"
    ]


def test_replicas_through_the_gateway_skip_a_dead_one_and_release_every_slot(
    tmp_path: Path, mock: MockUpstream
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    live = f"{mock.base_url}/v1"
    text = f"""
providers:
  vllm: {{type: openai, base_url: "{live}", key_required: false, self_hosted: true,
          replicas: ["{dead}", "{live}"], balance: round_robin}}
models:
  local: {{provider: vllm, upstream: mock-small, price: {{input: 0.01, output: 0.02}}}}
routes:
  auto: {{targets: [local], retries: 0, cache: {{mode: "off"}}}}
"""
    gw = start_gateway(tmp_path, text)
    try:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        for i in range(4):
            r = gw.post("/v1/chat/completions", {**body, "stream": i % 2 == 1})
            assert r.status_code == 200 and r.headers["x-switchyard-provider"] == "vllm"
            if i % 2 == 1:
                assert r.text.rstrip().endswith("data: [DONE]")
        assert len(mock.requests()) == 4
        provider = gw.app_state.services.providers["vllm"]
        assert type(provider).__name__ == "ReplicatedProvider"
        assert provider.chooser.in_flight == [0, 0]  # streams gave their slots back
        assert provider.chooser.breakers[0].failures >= 1  # the dead replica was tried and noted
        assert provider.chooser.breakers[1].failures == 0
        gw.write_policy(text.replace("round_robin", "least_loaded"))
        assert (
            gw.post("/admin/policy/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"}).status_code
            == 200
        )
        rebuilt = gw.app_state.services.providers["vllm"]
        assert rebuilt is not provider and rebuilt.chooser.mode == "least_loaded"
    finally:
        gw.stop()


def test_a_slow_probe_spills_without_calling_the_replica_down() -> None:
    """A probe that times out (a busy server) spills the replica's requests ("slow") but keeps it
    up until SLOW_DOWN_AFTER such probes in a row; one answered probe clears it; a refused one
    is down at once."""
    load = EngineLoadPolicy(max_waiting=8)
    r = ReplicaState("http://x/v1")
    r.observe(ReplicaSample(waiting=1.0), 1.0)
    r.observe(SLOW, 2.0)
    assert r.saturation(load) == "slow" and r.up is True and r.values()["up"] == 1.0
    for n in range(SLOW_DOWN_AFTER - 2):  # one short of the limit: still up
        r.observe(SLOW, 3.0 + n)
    assert r.saturation(load) == "slow" and r.up is True
    r.observe(SLOW, 8.0)
    assert r.saturation(load) == "down" and r.up is False
    r.observe(ReplicaSample(waiting=1.0), 9.0)
    assert r.saturation(load) is None and r.slow == 0
    r.observe(None, 10.0)
    assert r.saturation(load) == "down"


async def test_the_probe_tells_a_busy_replica_from_a_gone_one() -> None:
    """Real HTTP on loopback: /metrics answering after the probe's timeout reads SLOW; a port
    nobody listens on reads down; a prompt answer is a sample."""
    gate = asyncio.Event()

    async def metrics(request: web.Request) -> web.Response:
        if request.query.get("slow"):
            await gate.wait()
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            assert await _scrape(session, f"http://127.0.0.1:{port}/metrics", 1.0) == parse_vllm_metrics(
                METRICS
            )
            assert await _scrape(session, f"http://127.0.0.1:{port}/metrics?slow=1", 0.2) == SLOW
            assert await _scrape(session, f"http://127.0.0.1:{free_port()}/metrics", 1.0) is None
    finally:
        gate.set()
        await runner.cleanup()
