"""Graceful shutdown: SIGTERM while streams are in flight. The streams finish (each ends with
[DONE] and gets its ledger row), new connections are refused at once, and the process exits
within ``--graceful-timeout``; a stream longer than that deadline is cut (never a clean end)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from load_tests.mock_upstream import MockUpstream
from load_tests.scenarios.served import ServedGateway, scenario_policy


def _stream(gw: ServedGateway, out: list[str], started: threading.Event, idx: int, timeout: float) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"drain {idx}"}], "stream": True}
    text: list[str] = []
    try:
        with (
            httpx.Client(timeout=timeout) as client,
            client.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=gw.headers()) as r,
        ):
            for line in r.iter_lines():
                text.append(line)
                if line.startswith("data: "):
                    started.set()
    except httpx.HTTPError as exc:
        text.append(f"transport error: {type(exc).__name__}")
    out[idx] = "\n".join(text)


def run_drain(
    workdir: Path, *, streams: int = 4, tokens: int = 20, itl_ms: float = 100.0, graceful_s: float = 10.0
) -> dict[str, Any]:
    """Returns the figures: streams completed with [DONE], cut, refused newcomers, exit time,
    ledger rows by status."""
    with MockUpstream(ttft_ms=0, itl_ms=itl_ms, tokens=tokens) as mock:
        policy = scenario_policy(mock.base_url).replace(
            "stream_idle_timeout_s: 1.0", "stream_idle_timeout_s: 30"
        )
        gw = ServedGateway(workdir, policy, args=["--graceful-timeout", str(graceful_s)])
        gw.start()
        try:
            gw.key()
            texts = [""] * streams
            events = [threading.Event() for _ in range(streams)]
            stream_timeout = tokens * itl_ms / 1000.0 + 30
            threads = [
                threading.Thread(target=_stream, args=(gw, texts, events[i], i, stream_timeout), daemon=True)
                for i in range(streams)
            ]
            for t in threads:
                t.start()
            for e in events:
                e.wait(10)
            t0 = time.monotonic()
            gw.terminate()
            time.sleep(0.3)
            refused = accepted_late = 0
            for _ in range(3):
                try:
                    r = httpx.post(
                        gw.url + "/v1/chat/completions",
                        json={"model": "auto", "messages": [{"role": "user", "content": "late"}]},
                        headers=gw.headers(),
                        timeout=5,
                    )
                    accepted_late += r.status_code == 200
                except httpx.ConnectError:
                    refused += 1
            for t in threads:
                t.join(stream_timeout)
            rc = gw.wait(graceful_s + 20)
            exit_s = time.monotonic() - t0
        finally:
            gw.kill()
        rows = gw.ledger_rows()
        done = sum(1 for t in texts if t.rstrip().endswith("data: [DONE]"))
        statuses: dict[str, int] = {}
        for row in rows:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        return {
            "streams": streams,
            "stream_seconds": tokens * itl_ms / 1000.0,
            "graceful_timeout_s": graceful_s,
            "completed_with_done": done,
            "cut": streams - done,
            "late_requests_refused": refused,
            "late_requests_served": accepted_late,
            "exit_code": rc,
            "exit_s": round(exit_s, 3),
            "ledger_rows": len(rows),
            "ledger_statuses": statuses,
            "rows_lost": max(0, streams - len(rows)),
            "traceback_in_log": "Traceback" in gw.log(),
            "texts": texts,
        }
