"""Fault mix under load: a steady rate of JSON and streaming requests while a share of the
upstream calls fail in every way the mock can (statuses, resets, stalls, cuts, malformed JSON
and SSE, wrong content types, oversized bodies). Every response must be a success, a clean
OpenAI-shaped error or a stream flagged as broken, and every request must leave a ledger row."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from load_tests.mock_upstream import MockUpstream, new_event_loop
from load_tests.scenarios.served import ServedGateway, scenario_policy
from load_tests.scenarios.traffic import open_loop

FAULTS: list[dict[str, Any]] = [
    {"kind": "status", "status": 500},
    {"kind": "status", "status": 502},
    {"kind": "status", "status": 503},
    {"kind": "status", "status": 429, "retry_after": 0},
    {"kind": "reset"},
    {"kind": "stall", "seconds": 1.5},
    {"kind": "stall_mid_stream", "after_chunks": 2, "seconds": 1.5},
    {"kind": "cut_mid_stream", "after_chunks": 2},
    {"kind": "malformed_json"},
    {"kind": "malformed_sse", "after_chunks": 2},
    {"kind": "wrong_content_type"},
    {"kind": "huge", "bytes": 200_000},
]


def run_fault_mix(
    workdir: Path, *, rps: float = 30.0, seconds: float = 10.0, fault_rate: float = 0.3, seed: int = 7
) -> dict[str, Any]:
    rng = random.Random(seed)
    with MockUpstream(ttft_ms=2, itl_ms=1, tokens=8) as mock:
        gw = ServedGateway(workdir, scenario_policy(mock.base_url), args=["--log-level", "warning"])
        with gw:
            gw.key()
            injected = [0]

            def tick(i: int) -> None:
                if rng.random() < fault_rate:
                    mock.add_fault(**rng.choice(FAULTS))
                    injected[0] += 1

            def body(i: int) -> dict[str, Any]:
                b: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": f"mix {i}"}]}
                if i % 2:
                    b["stream"] = True
                return b

            loop = new_event_loop()
            try:
                asyncio.set_event_loop(loop)
                out = loop.run_until_complete(
                    open_loop(gw.url + "/v1/chat/completions", gw.headers(), rps, seconds, body, on_tick=tick)
                )
            finally:
                asyncio.set_event_loop(None)
                loop.close()
            left = len(mock.faults())
            mock.clear_faults()
            rows = gw.wait_rows(out.total, timeout=20)
            alive = gw.proc is not None and gw.proc.poll() is None
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {
        "load": f"{rps:g} req/s for {seconds:g} s, half streaming",
        **out.summary(),
        "faults_injected": injected[0],
        "faults_hit": injected[0] - left,
        "ledger_rows": len(rows),
        "ledger_statuses": statuses,
        "rows_lost": max(0, out.total - len(rows)),
        "gateway_alive": alive,
    }
