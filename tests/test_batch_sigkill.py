"""SIGKILL of a real ``switchyard serve`` in the middle of a batch: after a restart on the same
home the batch completes with every item once: one result line per input line, one ledger row
per item (carrying the batch id), and the upstream called again only for the items that were
in flight at the kill (their answers never reached the gateway's database)."""

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

from load_tests.bench_procs import POLICY_TEMPLATE, GatewayProcess
from load_tests.mock_upstream import MockUpstream
from tests.durability_load import ADMIN_KEY

ITEMS = 300
CONCURRENCY = 8
POLICY = (
    POLICY_TEMPLATE.replace(
        "    targets: [mock-small]\n",
        f"    targets: [mock-small]\n    batch: {{{{concurrency: {CONCURRENCY}, yield_above: null}}}}\n",
    )
    + "batches:\n  poll_interval_s: 0.02\n  lease_s: 1.0\n"
)


@contextlib.contextmanager
def _serve(home: Path, port: int) -> Iterator[tuple[GatewayProcess, str]]:
    home.mkdir(parents=True, exist_ok=True)
    gw, key = GatewayProcess.start(home, port, ADMIN_KEY, None, timeout=90, policy_template=POLICY)
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


def test_sigkill_mid_batch_loses_no_item_and_repeats_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "bench", "messages": [{"role": "user", "content": f"item {i}"}]}}
        for i in range(ITEMS)
    ]  # fmt: skip
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    with MockUpstream(ttft_ms=15, itl_ms=0, tokens=4) as mock:
        port = int(mock.base_url.rsplit(":", 1)[1])
        with _serve(home, port) as (gw, key), _client(gw, key) as c:
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
            os.kill(gw.proc.pid, signal.SIGKILL)  # mid-batch: no shutdown, no release
            gw.proc.wait(10)
            before = _batch_count(home, batch_id)
        assert 0 < before < ITEMS, "the kill must land mid-batch"
        with _serve(home, port) as (gw, key), _client(gw, key) as c:
            deadline = time.monotonic() + 90
            while (b := _batch(c, batch_id))["status"] != "completed":
                assert time.monotonic() < deadline, b
                time.sleep(0.05)
            assert b["request_counts"] == {"total": ITEMS, "completed": ITEMS, "failed": 0}
            out = c.get(f"/v1/files/{b['output_file_id']}/content").text.splitlines()
        served = mock.state.served
    results = [json.loads(x) for x in out]
    assert sorted(r["custom_id"] for r in results) == sorted(f"c{i}" for i in range(ITEMS))  # each once
    conn = sqlite3.connect(home / "ledger.db")
    try:
        rows = conn.execute(
            "SELECT request_id, status FROM ledger WHERE batch_id = ?", (batch_id,)
        ).fetchall()
        attempts = dict(conn.execute("SELECT idx, attempts FROM batch_items WHERE batch_id = ?", (batch_id,)))
    finally:
        conn.close()
    assert len(rows) == ITEMS and {s for _, s in rows} == {"ok"}
    assert {r for r, _ in rows} == {x["response"]["request_id"] for x in results}
    rerun = sum(1 for n in attempts.values() if n > 1)
    assert rerun <= CONCURRENCY  # only what was in flight at the kill was claimed again
    assert (
        ITEMS <= served <= ITEMS + rerun
    )  # the upstream saw each item once, the in-flight ones at most twice
    print(
        f"\n{before} items done before SIGKILL, {rerun} re-run after it, {served} upstream calls for {ITEMS}"
    )


def _batch_count(home: Path, batch_id: str) -> int:
    conn = sqlite3.connect(home / "ledger.db")
    try:
        row = conn.execute(
            "SELECT COUNT(*) FROM batch_items WHERE batch_id = ? AND status = 'succeeded'", (batch_id,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()
