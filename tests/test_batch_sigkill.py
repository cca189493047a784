"""SIGKILL of a real ``switchyard serve`` in the middle of a batch: after a restart on the same
home the batch completes with every item once: one result line per input line, one ledger row
per item (carrying the batch id), and the upstream RAN each item once: the items in flight at
the kill (their answers never reached the gateway's database) are sent again under the same
``Idempotency-Key``, which the mock upstream honours as an idempotent provider does (the
first answer again, not a second run). With ``on_interrupted: fail`` they are not sent again:
they end in the error file as ``batch_item_interrupted``, and no key is sent twice."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from load_tests.bench_procs import POLICY_TEMPLATE, GatewayProcess
from load_tests.mock_upstream import MockUpstream
from tests.durability_load import ADMIN_KEY

ITEMS = 300
CONCURRENCY = 8


def _policy(on_interrupted: str) -> str:
    batch = f"{{{{concurrency: {CONCURRENCY}, yield_above: null, on_interrupted: {on_interrupted}}}}}"
    return (
        POLICY_TEMPLATE.replace(
            "    targets: [mock-small]\n", f"    targets: [mock-small]\n    batch: {batch}\n"
        )
        + "batches:\n  poll_interval_s: 0.02\n  lease_s: 1.0\n"
    )


@contextlib.contextmanager
def _serve(home: Path, port: int, on_interrupted: str) -> Iterator[tuple[GatewayProcess, str]]:
    home.mkdir(parents=True, exist_ok=True)
    gw, key = GatewayProcess.start(
        home, port, ADMIN_KEY, None, timeout=90, policy_template=_policy(on_interrupted)
    )
    try:
        yield gw, key
    finally:
        gw.stop()


def _client(gw: GatewayProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {key}"}, timeout=10)


def _batch(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/batches/{batch_id}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.mark.parametrize("on_interrupted", ["resend", "fail"])
def test_sigkill_mid_batch_loses_no_item_and_runs_none_twice(tmp_path: Path, on_interrupted: str) -> None:
    home = tmp_path / "home"
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "bench", "messages": [{"role": "user", "content": f"item {i}"}]}}
        for i in range(ITEMS)
    ]  # fmt: skip
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    with MockUpstream(ttft_ms=15, itl_ms=0, tokens=4) as mock:
        port = int(mock.base_url.rsplit(":", 1)[1])
        with _serve(home, port, on_interrupted) as (gw, key), _client(gw, key) as c:
            up = c.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
            assert up.status_code == 200, up.text
            body = {
                "input_file_id": up.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            r = c.post("/v1/batches", json=body)
            assert r.status_code == 200, r.text
            batch_id = r.json()["id"]
            deadline = time.monotonic() + 60
            while _batch(c, batch_id)["request_counts"]["completed"] < ITEMS // 3:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            while not _sent_unfinished(home, batch_id):  # kill while calls are in flight
                assert time.monotonic() < deadline
            time.sleep(0.005)  # sent: at the upstream, inside its 15 ms to answer
            os.kill(gw.proc.pid, signal.SIGKILL)  # mid-batch: no shutdown, no release
            gw.proc.wait(10)
            before = _batch_count(home, batch_id)
        assert 0 < before < ITEMS, "the kill must land mid-batch"
        in_flight = _sent_unfinished(home, batch_id)  # recorded as sent, no result: cut by the kill
        with _serve(home, port, on_interrupted) as (gw, key), _client(gw, key) as c:
            deadline = time.monotonic() + 90
            while (b := _batch(c, batch_id))["status"] != "completed":
                assert time.monotonic() < deadline, b
                time.sleep(0.05)
            counts = b["request_counts"]
            out = c.get(f"/v1/files/{b['output_file_id']}/content").text.splitlines()
            err = (
                c.get(f"/v1/files/{b['error_file_id']}/content").text.splitlines()
                if b["error_file_id"]
                else []
            )
        calls = [r for r in mock.state.requests() if r["path"] == "/v1/chat/completions"]
        served, replayed, executions = mock.state.served, mock.state.replayed, mock.state.executions
    results = [json.loads(x) for x in out]
    errors = [json.loads(x) for x in err]
    ids = sorted(r["custom_id"] for r in results + errors)
    assert ids == sorted(f"c{i}" for i in range(ITEMS))  # every item once: none lost, none twice
    keys = [r["headers"].get("idempotency-key") for r in calls]
    assert len(calls) == served and None not in keys  # every upstream call carried its item's key
    assert len(set(keys)) == executions  # one run upstream per distinct key
    conn = sqlite3.connect(home / "ledger.db")
    try:
        rows = conn.execute(
            "SELECT request_id, status FROM ledger WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        attempts = dict(conn.execute("SELECT idx, attempts FROM batch_items WHERE batch_id = ?", (batch_id,)))
    finally:
        conn.close()
    rerun = sum(1 for n in attempts.values() if n > 1)
    assert rerun <= CONCURRENCY  # only what was in flight at the kill was claimed again
    assert len(rows) == len(results) and {s for _, s in rows} == {"ok"}
    assert {r for r, _ in rows} == {x["response"]["request_id"] for x in results}
    if on_interrupted == "resend":
        assert counts == {"total": ITEMS, "completed": ITEMS, "failed": 0} and not errors
        assert executions == ITEMS  # the upstream RAN each item once, the resent ones included
        assert served - ITEMS == replayed  # each call past the first of its key was a replay
    else:
        assert len(errors) == in_flight <= CONCURRENCY and counts["failed"] == in_flight
        assert all(e["response"]["body"]["error"]["code"] == "batch_item_interrupted" for e in errors)
        assert replayed == 0 and served == len(set(keys))  # no key was sent twice
        assert executions <= ITEMS
    print(
        f"\n[{on_interrupted}] {before} items done before SIGKILL, {in_flight} sent and cut by it, "
        f"{rerun} claimed again; upstream: {served} calls, {replayed} replays, {executions} runs for {ITEMS}"
    )


def _sent_unfinished(home: Path, batch_id: str) -> int:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM batch_items WHERE batch_id = ? AND status = 'running' AND result IS NOT NULL",
            (batch_id,),
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def _batch_count(home: Path, batch_id: str) -> int:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM batch_items WHERE batch_id = ? AND status = 'succeeded'", (batch_id,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()
