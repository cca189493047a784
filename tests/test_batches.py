"""The Files and Batch APIs end to end through a real gateway with the official SDKs: the
``openai`` SDK's flow (upload, create, poll, results and error files) and the ``anthropic``
SDK's Message Batches (create, poll, results); per-line errors; tenants see only their own
files and batches; every item is a ledger row carrying its batch id."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

POLICY_EXTRA = """
batches:
  poll_interval_s: 0.05
"""


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Any:
    g = start_gateway(tmp_path, mock_policy(mock.base_url, POLICY_EXTRA))
    try:
        yield g
    finally:
        g.stop()


def _lines(n: int, endpoint: str = "/v1/chat/completions") -> list[dict[str, Any]]:
    return [
        {"custom_id": f"req-{i}", "method": "POST", "url": endpoint,
         "body": {"model": "small", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 5}}
        for i in range(n)
    ]  # fmt: skip


def _jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (json.dumps(x) if not isinstance(x, bytes) else x.decode()).encode() + b"\n" for x in lines
    )


def _wait(fetch: Any, done: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        obj = fetch()
        if done(obj):
            return obj
        assert time.monotonic() < deadline, f"not done in {timeout} s: {obj}"
        time.sleep(0.05)


def test_openai_sdk_batch_flow_with_bad_lines(gw: RunningGateway) -> None:
    good = _lines(6)
    bad = [b"{not json", {"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "small", "messages": [{"role": "user", "content": "again"}]}},
           {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings", "body": {"model": "small"}}]  # fmt: skip
    with openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0) as client:
        f = client.files.create(file=("in.jsonl", _jsonl([*good, *bad])), purpose="batch")
        assert f.purpose == "batch" and f.bytes > 0
        assert client.files.retrieve(f.id).id == f.id
        assert f.id in [x.id for x in client.files.list()]
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                      metadata={"job": "nightly"})  # fmt: skip
        assert batch.status == "in_progress" and batch.request_counts is not None
        assert batch.request_counts.total == 9
        assert [e.line for e in batch.errors.data] == [7, 8, 9]  # type: ignore[union-attr]
        done = _wait(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.request_counts.completed == 6 and done.request_counts.failed == 3
        assert done.output_file_id and done.error_file_id
        out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        errs = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
        assert batch.id in [b.id for b in client.batches.list()]
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(6)]
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["object"] == "chat.completion"
               for x in out)  # fmt: skip
    codes = {x["error"]["code"] for x in errs}
    assert codes == {"invalid_json_line", "duplicate_custom_id", "mismatched_endpoint"}
    rows = [r for r in gw.ledger_rows() if r["batch_id"] == batch.id]
    assert len(rows) == 6 and all(r["status"] == "ok" and r["tenant"] == "team-a" for r in rows)
    assert {r["request_id"] for r in rows} == {x["response"]["request_id"] for x in out}
    assert all(r["cost_usd"] is not None for r in rows)


def test_embeddings_batch_and_an_item_the_upstream_refuses(gw: RunningGateway) -> None:
    lines = [{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "embed", "input": "hi"}},
             {"custom_id": "e2", "method": "POST", "url": "/v1/embeddings", "body": {"model": "nope", "input": "x"}}]  # fmt: skip
    with openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0) as client:
        f = client.files.create(file=("e.jsonl", _jsonl(lines)), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
        done = _wait(lambda: client.batches.retrieve(b.id), lambda x: x.status == "completed")
        assert done.request_counts.completed == 1 and done.request_counts.failed == 1
        err = json.loads(client.files.content(done.error_file_id).text)
    assert err["custom_id"] == "e2" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["param"] == "model"


def test_files_and_batches_are_tenant_scoped_and_bad_requests_change_nothing(gw: RunningGateway) -> None:
    with (
        openai.OpenAI(base_url=gw.base_url, api_key=gw.key("team-a"), max_retries=0) as a,
        openai.OpenAI(base_url=gw.base_url, api_key=gw.key("team-b"), max_retries=0) as b,
    ):
        f = a.files.create(file=("in.jsonl", _jsonl(_lines(1))), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            b.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError):
            b.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.BadRequestError):
            a.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
        with pytest.raises(openai.BadRequestError):
            a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError):
            a.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")  # type: ignore[arg-type]
        assert a.batches.list().data == []
        batch = a.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            b.batches.retrieve(batch.id)
        assert b.batches.list().data == []
        assert a.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            a.files.content(f.id)


def test_cancel_ends_what_has_not_run(tmp_path: Path, mock: MockUpstream) -> None:
    extra = POLICY_EXTRA + "\n" + "routes:\n  slow:\n    targets: [small]\n    batch: {concurrency: 1}\n"
    policy = mock_policy(mock.base_url).replace("routes:\n", "routes:\n  slow:\n    targets: [small]\n"
                                                "    batch: {concurrency: 1}\n", 1) + POLICY_EXTRA  # fmt: skip
    del extra
    g = start_gateway(tmp_path, policy)
    try:
        lines = [{**x, "body": {**x["body"], "model": "slow"}} for x in _lines(200)]
        with openai.OpenAI(base_url=g.base_url, api_key=g.key(), max_retries=0) as client:
            f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            assert client.batches.cancel(b.id).status == "cancelling"
            done = _wait(lambda: client.batches.retrieve(b.id), lambda x: x.status == "cancelled")
            assert done.request_counts.total == 200
            assert 0 < done.request_counts.failed <= 200
            errs = client.files.content(done.error_file_id).text.splitlines()
        cancelled = [json.loads(x) for x in errs if "batch_cancelled" in x]
        assert len(cancelled) == done.request_counts.failed
        rows = [r for r in g.ledger_rows() if r["batch_id"] == b.id]
        assert len(rows) == done.request_counts.completed  # what ran is billed, what did not is not
    finally:
        g.stop()


def test_anthropic_sdk_message_batches(gw: RunningGateway) -> None:
    reqs = [{"custom_id": f"m{i}", "params": {"model": "claude", "max_tokens": 8,
                                              "messages": [{"role": "user", "content": f"hello {i}"}]}}
            for i in range(4)]  # fmt: skip
    reqs.append(
        {"custom_id": "bad", "params": {"model": "claude", "messages": [{"role": "user", "content": "x"}]}}
    )
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.key(), max_retries=0) as client:
        batch = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
        assert batch.type == "message_batch" and batch.processing_status == "in_progress"
        done = _wait(
            lambda: client.messages.batches.retrieve(batch.id), lambda b: b.processing_status == "ended"
        )
        assert done.request_counts.succeeded == 4 and done.request_counts.errored == 1
        results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
        assert batch.id in [b.id for b in client.messages.batches.list()]
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve("msgbatch_nope")
        assert client.messages.batches.cancel(batch.id).processing_status == "ended"
    assert {k: v.type for k, v in results.items()} == {
        **{f"m{i}": "succeeded" for i in range(4)},
        "bad": "errored",
    }
    assert results["m0"].message.role == "assistant"  # type: ignore[union-attr]
    rows = [r for r in gw.ledger_rows() if r["batch_id"] == batch.id]
    assert len(rows) == 4 and {r["endpoint"] for r in rows} == {"messages"}


def test_a_batch_over_the_budget_is_refused_whole(tmp_path: Path, mock: MockUpstream) -> None:
    policy = mock_policy(mock.base_url).replace(
        "tenants:\n", "tenants:\n  team-c:\n    budget: {daily_usd: 0.0001}\n"
    )
    g = start_gateway(tmp_path, policy + POLICY_EXTRA)
    try:
        with openai.OpenAI(base_url=g.base_url, api_key=g.key("team-c"), max_retries=0) as client:
            big = client.files.create(file=("big.jsonl", _jsonl(_lines(60))), purpose="batch")
            with pytest.raises(openai.RateLimitError) as exc:  # 60 worst cases > $0.0001
                client.batches.create(
                    input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            assert exc.value.code == "budget_exceeded"
            assert client.batches.list().data == []  # nothing stored, nothing held
            small = client.files.create(file=("small.jsonl", _jsonl(_lines(10))), purpose="batch")
            b = client.batches.create(
                input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = _wait(lambda: client.batches.retrieve(b.id), lambda x: x.status == "completed")
            assert done.request_counts.completed == 10
    finally:
        g.stop()


def test_completion_window_expires_what_has_not_run(tmp_path: Path, mock: MockUpstream) -> None:
    """Items still waiting at ``expires_at`` end as expired (the lane here never has room: a
    self-hosted engine whose probe fails counts as busy)."""
    engine = (  # its /metrics probe never answers: the lane never sees spare capacity
        "  engine:\n    type: openai\n    base_url: http://127.0.0.1:9/v1\n    key_required: false\n"
        "    self_hosted: true\n    load: {probe_interval_s: 0.1, probe_timeout_s: 0.1}\n"
    )
    policy = mock_policy(mock.base_url).replace("providers:\n", "providers:\n" + engine, 1)
    policy = policy.replace(
        "models:\n", "models:\n  local: {provider: engine, price: {input: 0, output: 0}}\n", 1
    )
    route = "  waiting:\n    targets: [local]\n    batch: {lane: self_hosted}\n"
    g = start_gateway(tmp_path, policy.replace("routes:\n", "routes:\n" + route, 1) + POLICY_EXTRA)
    try:
        lines = [{**x, "body": {**x["body"], "model": "waiting"}} for x in _lines(3)]
        with openai.OpenAI(base_url=g.base_url, api_key=g.key(), max_retries=0) as client:
            f = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            time.sleep(0.3)
            assert client.batches.retrieve(b.id).request_counts.completed == 0  # type: ignore[union-attr]
            conn = sqlite3.connect(g.home / "ledger.db")
            try:
                conn.execute("UPDATE batches SET expires_at = ? WHERE id = ?", (time.time() - 1, b.id))
                conn.commit()
            finally:
                conn.close()
            done = _wait(lambda: client.batches.retrieve(b.id), lambda x: x.status == "expired")
            assert done.expired_at is not None and done.request_counts.failed == 3  # type: ignore[union-attr]
            errs = [json.loads(x) for x in client.files.content(done.error_file_id or "").text.splitlines()]
        assert {e["error"]["code"] for e in errs} == {"batch_expired"} and len(errs) == 3
        assert not [r for r in g.ledger_rows() if r["batch_id"] == b.id]  # nothing ran, nothing billed
    finally:
        g.stop()
