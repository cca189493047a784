"""Three replicas, one gateway: three real `switchyard serve` processes with their own
SWITCHYARD_HOME, one PostgreSQL schema (ledger, keys, stored Responses), one Redis (limits,
stickiness, exact cache), a round-robin client. One case per promise a platform team scaling
out relies on. The cluster is started once for the module (bounded: about 30 s in all here).

The cases run in file order: the first one is the first traffic the fresh database sees."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx2 as httpx
import orjson
import pytest
import redis

from gateway.limits.budgets import period_bounds, to_nanos
from gateway.limits.keys_pg import PostgresKeyStore
from load_tests.mock_upstream import MockUpstream
from tests.cluster_support import Cluster, cluster
from tests.gateway_harness import mock_policy
from tests.limits_helpers import REDIS_URL, redis_prefix
from tests.pg_support import scratch_schema

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
RUN = uuid.uuid4().hex[:8]
TENANT = f"acme-{RUN}"
BUDGETED = f"budgeted-{RUN}"
BUDGET = Decimal("0.001")


@pytest.fixture(scope="module")
def mock() -> Iterator[MockUpstream]:
    with MockUpstream(tokens=8) as m:
        yield m


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory, mock: MockUpstream) -> Iterator[Cluster]:
    with redis_prefix("sytest-cluster") as prefix, scratch_schema("sy_cluster") as pg_url:
        extra = (
            f"limits: {{redis_url: '{REDIS_URL}', redis_prefix: '{prefix}', redis_timeout_s: 2}}\n"
            f"cache: {{backend: redis, redis_url: '{REDIS_URL}', ttl_s: 120}}\n"
        )
        text = mock_policy(mock.base_url, extra).replace(
            "tenants:\n", f"tenants:\n  {BUDGETED}:\n    budget: {{daily_usd: {BUDGET}}}\n", 1
        )
        text = text.replace("routes:\n", "routes:\n  pricey:\n    targets: [large]\n", 1)
        with cluster(tmp_path_factory.mktemp("cluster"), text, pg_url) as c:
            c.redis_prefix = prefix
            yield c


@pytest.fixture(scope="module")
def key(three: Cluster) -> str:
    return three.new_key(TENANT)[0]


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


def test_first_responses_on_a_fresh_database_on_every_replica_at_once(three: Cluster, key: str) -> None:
    """The stored-responses table is made by the start-up migrations, not by the first
    requests racing each other (2 of 3 answered 500 after the upstream was paid)."""

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            three.replica_url(i) + "/v1/responses",
                            json={"model": "auto", "input": f"first {i}", "store": True},
                            headers={"authorization": f"Bearer {key}"},
                        )
                        for i in range(3)
                    )
                )
            )

    got = asyncio.run(together())
    assert [r.status_code for r in got] == [200, 200, 200], [r.text[:200] for r in got]


def test_a_key_made_on_one_replica_is_limited_on_all_at_once(three: Cluster) -> None:
    key, _ = three.new_key(f"limited-{RUN}", 0, rpm=5, daily_usd="0.05")
    statuses = [three.post("/v1/chat/completions", ask(f"q{i}"), key, i).status_code for i in range(1, 13)]
    assert statuses.count(200) == 5 and statuses.count(429) == 7, statuses


def within(seconds: float, ok: Any) -> float:
    started = time.monotonic()
    while not ok():
        assert time.monotonic() - started < seconds, f"not on every replica within {seconds} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_limits_change_and_revoke_reach_every_replica_within_a_second(three: Cluster) -> None:
    key, key_id = three.new_key(f"changing-{RUN}", 0)
    for i in range(3):  # every replica has the key cached now
        assert three.post("/v1/chat/completions", ask(f"warm {i}"), key, i).status_code == 200
    r = three.admin("PUT", f"/admin/keys/{key_id}/limits", 1, {"daily_usd": "0.000001"})
    assert r.status_code == 200, r.text

    def refused_everywhere() -> bool:
        return all(three.post("/v1/chat/completions", ask("x"), key, i).status_code == 429 for i in (0, 2))

    within(1.0, refused_everywhere)
    store = PostgresKeyStore(three.pg_url)  # the CLI's way: straight into the store
    try:
        key2, rec = store.create(f"cli-{RUN}")
        for i in range(3):
            assert three.post("/v1/chat/completions", ask(f"cli {i}"), key2, i).status_code == 200
        assert store.revoke(rec.key_id)
    finally:
        store.close()
    within(
        1.0,
        lambda: all(
            three.post("/v1/chat/completions", ask("y"), key2, i).status_code == 401 for i in range(3)
        ),
    )


def test_a_tenant_budget_holds_across_replicas(three: Cluster) -> None:
    key, _ = three.new_key(BUDGETED, 2)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            three.replica_url(i) + "/v1/chat/completions",
                            json={**ask(f"budget {i}"), "model": "pricey"},
                            headers={"authorization": f"Bearer {key}"},
                        )
                        for i in range(30)
                    )
                )
            )

    got = asyncio.run(burst())
    codes = [r.status_code for r in got]
    assert 0 < codes.count(200) < 30 and codes.count(200) + codes.count(429) == 30, codes
    ids = [r.headers["x-request-id"] for r in got if r.status_code == 200]

    def shipped() -> bool:
        return len(three.ledger("WHERE request_id = ANY(%s)", (ids,))) == len(ids)

    within(10.0, shipped)
    rows = three.ledger("WHERE tenant = %s AND cost_usd IS NOT NULL", (BUDGETED,))
    spent = sum((Decimal(str(row[2])) for row in rows), Decimal(0))
    assert 0 < spent <= BUDGET
    # every reservation settled to the real cost or released: the shared counter is the ledger's sum
    client = redis.Redis.from_url(REDIS_URL)
    counter = f"{three.redis_prefix}budget:tenant:{BUDGETED}:day:" + period_bounds("day", time.time())[0]
    try:
        within(5.0, lambda: int(client.get(counter) or 0) == to_nanos(spent))
    finally:
        client.close()


def test_the_exact_cache_is_shared(three: Cluster, key: str) -> None:
    body = ask(f"cache me {RUN}", temperature=0)
    first = three.post("/v1/chat/completions", body, key, 0)
    second = three.post("/v1/chat/completions", body, key, 1)
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "hit"
    assert second.json()["choices"] == first.json()["choices"]


def test_a_responses_chain_continues_on_another_replica(three: Cluster, key: str, mock: MockUpstream) -> None:
    first = three.post("/v1/responses", {"model": "auto", "input": f"remember {RUN}", "store": True}, key, 0)
    assert first.status_code == 200, first.text
    mock.clear_requests()
    second = three.post(
        "/v1/responses",
        {"model": "auto", "input": "and now?", "previous_response_id": first.json()["id"]},
        key,
        1,
    )
    assert second.status_code == 200, second.text
    sent = repr(mock.requests()[-1]["body"])
    assert f"remember {RUN}" in sent  # replica 1 read the chain replica 0 stored


def test_a_batch_flow_spread_over_the_replicas(three: Cluster, key: str) -> None:
    """The openai SDK's batch flow with each step on another replica: the input file uploaded
    through one, the batch created through the next, polled through the third, its output
    file downloaded through the first (files live in the shared database, not a replica's
    home; the batch runs on whichever replica claims its items)."""
    import openai

    def sdk(i: int) -> openai.OpenAI:
        return openai.OpenAI(base_url=three.replica_url(i) + "/v1", api_key=key, max_retries=0)

    lines = [
        {
            "custom_id": f"row-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": ask(f"batch item {n} {RUN}"),
        }
        for n in range(3)
    ]
    data = "\n".join(orjson.dumps(line).decode() for line in lines).encode()
    uploaded = sdk(0).files.create(file=("in.jsonl", data), purpose="batch")
    assert sdk(2).files.retrieve(uploaded.id).bytes == len(data)
    batch = sdk(1).batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = sdk(2).batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    assert batch.output_file_id is not None
    out = sdk(0).files.content(batch.output_file_id).text.splitlines()
    assert sorted(orjson.loads(x)["custom_id"] for x in out) == ["row-0", "row-1", "row-2"]
    listed = [f.id for f in sdk(1).files.list(purpose="batch")]
    assert uploaded.id in listed
    assert sdk(2).files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        sdk(0).files.retrieve(uploaded.id)


def test_a_conversation_keeps_its_model_on_every_replica(
    three: Cluster, key: str, mock: MockUpstream
) -> None:
    system = {"role": "system", "content": f"You are terse {RUN}."}
    turn1 = [system, {"role": "user", "content": "first"}]
    mock.add_fault(kind="status", status=500, model="claude-mock", times=1)
    first = three.post("/v1/chat/completions", {"model": "anthropic-first", "messages": turn1}, key, 0)
    assert first.status_code == 200 and first.headers["x-switchyard-model"] == "small"  # the fallback
    time.sleep(0.2)  # the background write of where it lives
    for i in (1, 2):
        turn = [*turn1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"turn {i}"}]
        r = three.post("/v1/chat/completions", {"model": "anthropic-first", "messages": turn}, key, i)
        assert r.status_code == 200 and r.headers["x-switchyard-model"] == "small", r.headers
    fresh = [{**system, "content": f"another {RUN}"}, {"role": "user", "content": "first"}]
    r = three.post("/v1/chat/completions", {"model": "anthropic-first", "messages": fresh}, key, 1)
    assert r.headers["x-switchyard-model"] == "claude"  # a new conversation starts on the first


def test_a_replica_killed_mid_load_loses_no_ledger_row(three: Cluster, key: str) -> None:
    done: list[str] = []
    stop = threading.Event()

    def client(t: int) -> None:
        i = t
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                i += 1
                try:
                    r = c.post(
                        three.replica_url(i) + "/v1/chat/completions",
                        json=ask(f"load {t}-{i}"),
                        headers={"authorization": f"Bearer {key}"},
                    )
                except httpx.TransportError:
                    continue  # the killed replica
                if r.status_code == 200:
                    done.append(r.headers["x-request-id"])

    workers = [threading.Thread(target=client, args=(t,), daemon=True) for t in range(4)]
    for w in workers:
        w.start()
    try:
        within(20.0, lambda: len(done) >= 60)
        victim = three.replicas[2]
        victim.kill()  # no shutdown, no flush: its rows are in its outbox
        time.sleep(0.3)
    finally:
        stop.set()
        for w in workers:
            w.join(15)
    victim.launch()  # the same home: its outbox ships on start
    victim.wait_ready(time.monotonic() + 30)
    completed = set(done)
    assert len(completed) >= 60

    def all_rows() -> bool:
        return len(three.ledger("WHERE request_id = ANY(%s)", (list(completed),))) == len(completed)

    within(20.0, all_rows)


def test_mixed_protocols_on_every_replica_are_one_ledger_row_each(three: Cluster) -> None:
    key, _ = three.new_key(f"mixed-{RUN}", 1)
    sent = [
        ("/v1/chat/completions", ask("mixed chat")),
        ("/v1/chat/completions", ask("mixed stream", stream=True)),
        (
            "/v1/messages",
            {"model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": "mixed"}]},
        ),
        ("/v1/responses", {"model": "auto", "input": "mixed", "store": False}),
    ]
    ids = []
    for i in range(12):
        path, body = sent[i % len(sent)]
        r = three.post(path, body, key, i)
        assert r.status_code == 200, (path, r.text[:200])
        ids.append(r.headers["x-request-id"])
    assert len(set(ids)) == 12
    within(10.0, lambda: len(three.ledger("WHERE request_id = ANY(%s)", (ids,))) == 12)
    rows = three.ledger("WHERE tenant = %s", (f"mixed-{RUN}",))
    assert len(rows) == 12 and {r[1] for r in rows} == {"ok"}
    assert all(r[2] is not None and Decimal(str(r[2])) > 0 for r in rows)
