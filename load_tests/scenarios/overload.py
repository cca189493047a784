"""Overload: far more concurrent requests than ``server.max_in_flight`` against a slow
upstream. The excess is refused at once (503 + Retry-After), /healthz keeps answering, every
admitted request succeeds and gets its ledger row, and the gateway recovers; RSS stays
bounded across repeated bursts."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from load_tests.httpclient import Connection, Response, Target, build_request
from load_tests.mock_upstream import MockUpstream
from load_tests.scenarios.served import ServedGateway, scenario_policy


async def _one(target: Target, data: bytes, timeout: float) -> tuple[int, float, dict[str, str]]:
    t0 = time.perf_counter()
    try:
        conn = await Connection.open(target, keep_body=False)
    except OSError:
        return -1, time.perf_counter() - t0, {}
    try:
        resp: Response = await conn.request(data, timeout)
        return resp.status, time.perf_counter() - t0, resp.headers
    except Exception:
        return -2, time.perf_counter() - t0, {}
    finally:
        conn.close()


async def _probe_health(url: str, stop: asyncio.Event, out: list[float]) -> None:
    target = Target.from_url(url + "/healthz")
    data = f"GET /healthz HTTP/1.1\r\nhost: {target.host}:{target.port}\r\n\r\n".encode()
    while not stop.is_set():
        status, seconds, _ = await _one(target, data, 5.0)
        out.append(seconds if status == 200 else float("inf"))
        await asyncio.sleep(0.05)


async def _burst(gw: ServedGateway, clients: int, tag: str) -> dict[str, Any]:
    target = Target.from_url(gw.url + "/v1/chat/completions")
    headers = gw.headers()
    bodies = [
        build_request(
            target,
            json.dumps({"model": "auto", "messages": [{"role": "user", "content": f"{tag} {i}"}]}).encode(),
            headers,
        )
        for i in range(clients)
    ]
    stop = asyncio.Event()
    health: list[float] = []
    prober = asyncio.create_task(_probe_health(gw.url, stop, health))
    results = await asyncio.gather(*(_one(target, b, 30.0) for b in bodies))
    stop.set()
    await prober
    ok = [s for st, s, _ in results if st == 200]
    shed = [(s, h) for st, s, h in results if st == 503]
    other: dict[str, int] = {}
    for st, _, _ in results:
        if st not in (200, 503):
            other[str(st)] = other.get(str(st), 0) + 1
    shed_s = sorted(s for s, _ in shed)
    return {
        "clients": clients,
        "ok": len(ok),
        "shed_503": len(shed),
        "other": other,
        "shed_with_retry_after": sum(1 for _, h in shed if h.get("retry-after", "").isdigit()),
        "shed_ms_p50": round(statistics.median(shed_s) * 1000, 2) if shed_s else None,
        "shed_ms_max": round(shed_s[-1] * 1000, 2) if shed_s else None,
        "ok_ms_max": round(max(ok) * 1000, 1) if ok else None,
        "healthz_probes": len(health),
        "healthz_ms_max": round(max(health) * 1000, 2) if health else None,
    }


def run_overload(
    workdir: Path, *, max_in_flight: int = 16, clients: int = 200, bursts: int = 3, upstream_ms: float = 300.0
) -> dict[str, Any]:
    with MockUpstream(ttft_ms=upstream_ms, itl_ms=0, tokens=8) as mock:
        server = f"  max_in_flight: {max_in_flight}\n  overload_retry_after_s: 2"
        gw = ServedGateway(workdir, scenario_policy(mock.base_url, server=server))
        with gw:
            gw.key()
            rss_start = gw.rss_kib()
            runs = []
            rss_after = []
            for b in range(bursts):
                runs.append(asyncio.run(_burst(gw, clients, f"burst{b}")))
                rss_after.append(gw.rss_kib())
            # recovery: a modest load within capacity is served in full
            mock.configure(ttft_ms=0)
            recovery = asyncio.run(_burst(gw, max_in_flight // 2, "recovery"))
            admitted = sum(r["ok"] for r in runs) + recovery["ok"]
            rows = gw.wait_rows(admitted, timeout=15)
            fds = gw.open_fds()
        return {
            "max_in_flight": max_in_flight,
            "upstream_ms": upstream_ms,
            "bursts": runs,
            "recovery": recovery,
            "rss_start_kib": rss_start,
            "rss_after_bursts_kib": rss_after,
            "open_fds_after": fds,
            "admitted": admitted,
            "ledger_rows": len(rows),
            "rows_lost": max(0, admitted - len(rows)),
            "ledger_ok_rows": sum(1 for r in rows if r["status"] == "ok"),
        }
