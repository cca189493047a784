"""Lane ``provider``: the batch goes whole to the provider's own batch API (the mock
upstream's Files + Batches), no item is sent as a live request, and every item is a ledger
row priced at the provider's batch price (the model's ``price.batch`` share, here 50%), with
the savings cause ``batch``."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import openai

from gateway.ledger.report import savings_by_cause
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

ROUTE = """  nightly:
    targets: [small]
    baseline: large
    batch: {lane: provider}
"""


def test_provider_lane_forwards_and_prices_at_the_batch_price(tmp_path: Path, mock: MockUpstream) -> None:
    policy = mock_policy(mock.base_url).replace("price: {input: 0.15,", "price: {batch: 0.5, input: 0.15,", 1)
    policy = (
        policy.replace("routes:\n", "routes:\n" + ROUTE, 1)
        + "batches:\n  poll_interval_s: 0.05\n  upstream_poll_s: 0.05\n"
    )
    g = start_gateway(tmp_path, policy)
    try:
        lines = [
            {"custom_id": f"n{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "nightly", "messages": [{"role": "user", "content": f"night {i}"}], "max_tokens": 6}}
            for i in range(5)
        ]  # fmt: skip
        data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        with openai.OpenAI(base_url=g.base_url, api_key=g.key(), max_retries=0) as client:
            f = client.files.create(file=("n.jsonl", data), purpose="batch")
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            deadline = time.monotonic() + 20
            while (done := client.batches.retrieve(b.id)).status != "completed":
                assert time.monotonic() < deadline, done
                time.sleep(0.05)
            out = [json.loads(x) for x in client.files.content(done.output_file_id or "").text.splitlines()]
        assert done.request_counts is not None and done.request_counts.completed == 5
        assert sorted(x["custom_id"] for x in out) == [f"n{i}" for i in range(5)]
        assert all(x["response"]["body"]["object"] == "chat.completion" for x in out)
        paths = [(r["method"], r["path"]) for r in mock.state.requests()]
        assert ("POST", "/v1/files") in paths and ("POST", "/v1/batches") in paths
        assert ("POST", "/v1/chat/completions") not in paths  # no item went as a live request
        sent = [r for r in mock.state.requests() if r["path"] == "/v1/files"]
        assert len(sent) == 1
        every = g.ledger_rows()
        rows = [r for r in every if r["batch_id"] == b.id]
        assert len(rows) == 5, [(r["request_id"], r["batch_id"], r["status"]) for r in every]
        for r in rows:
            assert r["served_model"] == "small" and r["savings_cause"] == "batch" and r["status"] == "ok"
            listed = (
                Decimal(r["input_tokens"]) * Decimal("0.15") + Decimal(r["output_tokens"]) * Decimal("0.60")
            ) / 10**6
            assert Decimal(r["cost_usd"]) == listed / 2
            assert Decimal(r["baseline_cost_usd"]) > Decimal(r["cost_usd"])
        causes = {r["cause"]: r for r in savings_by_cause(g.home / "ledger.db", "day", 3600)}
        assert Decimal(causes["batch"]["savings_usd"]) > 0 and causes["batch"]["requests"] == 5
    finally:
        g.stop()


def test_a_message_batch_the_provider_cannot_take_runs_as_live_requests(
    tmp_path: Path, mock: MockUpstream
) -> None:
    """An Anthropic Message Batch on a provider-lane route whose provider speaks OpenAI's batch
    API: not forwarded (its items are Messages requests), run as ordinary requests instead."""
    import anthropic

    policy = mock_policy(mock.base_url).replace("price: {input: 0.15,", "price: {batch: 0.5, input: 0.15,", 1)
    policy = policy.replace("routes:\n", "routes:\n" + ROUTE, 1) + "batches:\n  poll_interval_s: 0.05\n"
    g = start_gateway(tmp_path, policy)
    try:
        reqs = [{"custom_id": f"m{i}", "params": {"model": "nightly", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(3)]  # fmt: skip
        with anthropic.Anthropic(base_url=g.url, api_key=g.key(), max_retries=0) as client:
            batch = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
            deadline = time.monotonic() + 20
            while client.messages.batches.retrieve(batch.id).processing_status != "ended":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            results = list(client.messages.batches.results(batch.id))
        assert [r.result.type for r in results] == ["succeeded"] * 3
        paths = [(r["method"], r["path"]) for r in mock.state.requests()]
        assert ("POST", "/v1/batches") not in paths and paths.count(("POST", "/v1/chat/completions")) == 3
        rows = [r for r in g.ledger_rows() if r["batch_id"] == batch.id]
        assert len(rows) == 3 and {r["savings_cause"] for r in rows} != {"batch"}  # list price, live
    finally:
        g.stop()


def test_a_message_batch_goes_to_anthropics_message_batches(tmp_path: Path, mock: MockUpstream) -> None:
    import anthropic

    route = "  nightly-claude:\n    targets: [claude]\n    batch: {lane: provider}\n"
    policy = mock_policy(mock.base_url).replace("price: {input: 3,", "price: {batch: 0.5, input: 3,", 1)
    policy = policy.replace("routes:\n", "routes:\n" + route, 1)
    g = start_gateway(tmp_path, policy + "batches:\n  poll_interval_s: 0.05\n  upstream_poll_s: 0.05\n")
    try:
        reqs = [{"custom_id": f"c{i}", "params": {"model": "nightly-claude", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": f"hey {i}"}]}} for i in range(3)]  # fmt: skip
        with anthropic.Anthropic(base_url=g.url, api_key=g.key(), max_retries=0) as client:
            batch = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
            deadline = time.monotonic() + 20
            while client.messages.batches.retrieve(batch.id).processing_status != "ended":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
        assert {k: v.type for k, v in results.items()} == {
            "c0": "succeeded",
            "c1": "succeeded",
            "c2": "succeeded",
        }
        assert results["c0"].message.role == "assistant"  # type: ignore[union-attr]
        paths = [(r["method"], r["path"]) for r in mock.state.requests()]
        assert ("POST", "/v1/messages/batches") in paths and ("POST", "/v1/messages") not in paths
        rows = [r for r in g.ledger_rows() if r["batch_id"] == batch.id]
        assert len(rows) == 3
        for r in rows:
            assert (
                r["served_model"] == "claude"
                and r["savings_cause"] == "batch"
                and r["provider"] == "mock-anthropic"
            )
            assert Decimal(r["cost_usd"]) * 2 == Decimal(r["baseline_cost_usd"])  # half the list price
    finally:
        g.stop()
