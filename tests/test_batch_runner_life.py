"""The batch runner's life around its batches: it backs off while no batch is open and a batch
created here wakes it at once; a revoked key stops its batches (the items not yet run fail
with the revocation error); the provider lane's create cut between the provider's batch and
the note of its id is found again by its metadata instead of being created twice; error lines
from a provider's batch are stored redacted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai

from gateway.config.policy import ParamsPolicy
from gateway.core.batch import Batch, NewItem
from gateway.flow import batch_forward
from gateway.ledger.batches import open_batch_store
from gateway.ledger.sqlite import connect, migrate
from gateway.limits.keys import KeyStore
from gateway.providers.openai_batch import OpenAIBatchUpstream
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway


def _lines(n: int) -> bytes:
    return b"".join(
        json.dumps(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "small", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 4}}
        ).encode() + b"\n"
        for i in range(n)
    )  # fmt: skip


def test_idle_runner_backs_off_and_a_create_wakes_it(tmp_path: Path, mock: MockUpstream) -> None:
    extra = "batches:\n  poll_interval_s: 0.05\n  idle_poll_s: 30\n"
    g = start_gateway(tmp_path, mock_policy(mock.base_url, extra))
    try:
        runner = g.app_state.gateway.batch_runner
        time.sleep(1.5)
        idle_turns = runner.turns
        assert idle_turns <= 6  # 0.05, 0.1, 0.2, 0.4, 0.8 s...: not one turn every 0.05 s (30)
        with openai.OpenAI(base_url=g.base_url, api_key=g.key(), max_retries=0) as client:
            f = client.files.create(file=("in.jsonl", _lines(3)), purpose="batch")
            t0 = time.monotonic()
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while client.batches.retrieve(b.id).status != "completed":
                assert time.monotonic() - t0 < 5, "the create did not wake the runner (idle_poll_s is 30 s)"
                time.sleep(0.02)
    finally:
        g.stop()


def test_a_revoked_key_stops_its_batch(tmp_path: Path) -> None:
    with MockUpstream(ttft_ms=100, itl_ms=0, tokens=4) as mock:
        extra = "batches:\n  poll_interval_s: 0.02\n"
        policy = mock_policy(mock.base_url, extra).replace(
            "  code:\n    targets: [small]\n",
            "  code:\n    targets: [small]\n    batch: {concurrency: 1}\n",
            1,
        )
        g = start_gateway(tmp_path, policy)
        try:
            key = g.key()
            lines = _lines(40).replace(b'"model": "small"', b'"model": "code"')
            with openai.OpenAI(base_url=g.base_url, api_key=key, max_retries=0) as client:
                f = client.files.create(file=("in.jsonl", lines), purpose="batch")
                b = client.batches.create(
                    input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            store = g.app_state.services.batches
            deadline = time.monotonic() + 20
            while asyncio.run(store.counts(b.id)).get("succeeded", 0) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            keys = KeyStore(g.settings.keys_db)
            (record,) = [r for r in keys.list() if r.tenant == "team-a"]
            assert keys.revoke(record.key_id)
            while (batch := asyncio.run(store.get(None, b.id))) is not None and batch.status != "completed":
                assert time.monotonic() < deadline, asyncio.run(store.counts(b.id))
                time.sleep(0.05)
            counts = asyncio.run(store.counts(b.id))
            assert counts.get("errored", 0) >= 20 and counts.get("succeeded", 0) + counts["errored"] == 40
            results = asyncio.run(store.results(b.id, 0, 100))
            failed = [json.loads(r.result or b"{}") for r in results if r.status == "errored"]
            assert {x["error"]["code"] for x in failed} == {"invalid_api_key"}
            assert b.id not in g.app_state.services.batch_holds.held  # nothing held for it any more
        finally:
            g.stop()


class _CutAfterCreate(OpenAIBatchUpstream):
    """The provider makes the batch, then the gateway never hears its id (a crash, a timeout)."""

    async def submit(self, endpoint: str, lines: bytes, timeout: float, metadata: dict[str, str]) -> str:
        await super().submit(endpoint, lines, timeout, metadata)
        raise TimeoutError("cut after the create")


class _CutBeforeCreate(OpenAIBatchUpstream):
    async def submit(self, endpoint: str, lines: bytes, timeout: float, metadata: dict[str, str]) -> str:
        raise TimeoutError("cut before the create")


def _store(tmp: Path) -> Any:
    conn = connect(tmp / "ledger.db")
    migrate(conn)
    conn.close()
    return open_batch_store(f"sqlite:///{tmp / 'ledger.db'}")


def _provider_batch(store: Any) -> Batch:
    now = time.time()
    batch = Batch("batch_x", "team-a", "k1", "openai", "/v1/chat/completions", "small", "file-1", "24h", None,
                  "in_progress", now, now + 86400, {"in_progress_at": now})  # fmt: skip
    body = b'{"model": "small", "messages": [{"role": "user", "content": "hi"}]}'
    asyncio.run(store.create(batch, [NewItem(i, f"c{i}", body) for i in range(3)]))
    return batch


def _submit(svc: Any, store: Any, batch: Batch, upstream: OpenAIBatchUpstream) -> None:
    plan = SimpleNamespace(policy=SimpleNamespace(params=ParamsPolicy()))
    target = SimpleNamespace(provider="mock", model="small", upstream_model="mock-small")
    with contextlib.suppress(TimeoutError):  # the cut: the create's answer never arrives
        asyncio.run(batch_forward.submit(svc, store, batch, plan, target, upstream))  # type: ignore[arg-type]


def test_a_provider_batch_whose_id_was_lost_is_found_by_its_metadata(
    tmp_path: Path, mock: MockUpstream
) -> None:
    store = _store(tmp_path)
    try:
        batch = _provider_batch(store)
        upstream = _CutAfterCreate("mock", mock.base_url + "/v1", None)
        svc = SimpleNamespace(
            policy=SimpleNamespace(batches=SimpleNamespace(max_items=100)), batch_upstreams={"mock": upstream}
        )
        _submit(svc, store, batch, upstream)
        saved = asyncio.run(store.get(None, batch.id))
        assert saved.upstream is not None and "id" not in saved.upstream  # the intent, no id
        made = [r for r in mock.state.requests() if (r["method"], r["path"]) == ("POST", "/v1/batches")]
        assert len(made) == 1
        foreign = dict(saved.upstream, owner="another-process")
        saved.upstream = foreign  # a fresh intent of another replica: maybe still being created
        asyncio.run(batch_forward.resume(svc, store, saved))  # type: ignore[arg-type]
        assert "id" not in foreign
        saved.upstream = dict(foreign, since=foreign["since"] - batch_forward.FOREIGN_INTENT_S)
        asyncio.run(batch_forward.resume(svc, store, saved))  # type: ignore[arg-type]
        up = asyncio.run(store.get(None, batch.id)).upstream
        assert up["id"] == next(iter(upstream_batches(mock)))  # followed, not created again
        made = [r for r in mock.state.requests() if (r["method"], r["path"]) == ("POST", "/v1/batches")]
        assert len(made) == 1
    finally:
        store.close()


def upstream_batches(mock: MockUpstream) -> list[str]:
    import httpx2 as httpx

    data = httpx.get(mock.base_url + "/v1/batches?limit=100").json()["data"]
    return [b["id"] for b in data]


def test_a_provider_batch_never_made_is_sent_again(tmp_path: Path, mock: MockUpstream) -> None:
    store = _store(tmp_path)
    try:
        batch = _provider_batch(store)
        upstream = _CutBeforeCreate("mock", mock.base_url + "/v1", None)
        svc = SimpleNamespace(
            policy=SimpleNamespace(batches=SimpleNamespace(max_items=100)), batch_upstreams={"mock": upstream}
        )
        _submit(svc, store, batch, upstream)
        saved = asyncio.run(store.get(None, batch.id))
        assert saved.upstream is not None and "id" not in saved.upstream
        assert asyncio.run(store.claim(batch.id, 10, 60)) == []  # held by the cut create
        asyncio.run(batch_forward.resume(svc, store, saved))  # type: ignore[arg-type]
        assert asyncio.run(store.get(None, batch.id)).upstream is None
        assert [c.idx for c in asyncio.run(store.claim(batch.id, 10, 60))] == [0, 1, 2]  # to send again
    finally:
        store.close()


def test_error_lines_of_a_provider_batch_are_stored_redacted() -> None:
    secret = "sk-upstream-canary-0123456789abcdef"
    body = {"error": {"message": f"Incorrect API key provided: {secret}", "details": [secret, 3]}}
    shown = json.dumps(batch_forward._scrubbed(body, (secret,)))
    assert secret not in shown and "0123456789abcdef" not in shown and '"details"' in shown
