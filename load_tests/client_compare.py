"""Which HTTP client should the gateway use upstream? Measure, don't guess.

`python -m load_tests.client_compare [--seconds 4] [--out DIR]` starts the mock upstream
(pinned to CPU 1), then drives it from this process (pinned to CPU 0, uvloop as the gateway
runs) with 32 concurrent clients in a closed loop, with the gateway's unary client
(gateway/providers/h1.py), aiohttp (the gateway's stream client) and httpx (via httpx2, what
the openai SDK uses), each doing what the gateway does per request: POST a JSON body, read
the whole answer, parse it. Reports req/s and this process's CPU per request (the figure
that counts on a shared core). Writes JSON and Markdown to DIR."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import httpx2 as httpx
import orjson
import uvloop

from gateway.providers.h1 import H1Pool
from load_tests.bench_procs import MockProcess, machine_info

BODY = orjson.dumps({"model": "mock-small", "messages": [{"role": "user", "content": "hello"}]})
HEADERS = {"content-type": "application/json", "authorization": "Bearer mock-key"}
CONCURRENCY = 32


async def _closed_loop(one: Callable[[], Awaitable[None]], seconds: float) -> tuple[float, float]:
    """(req/s, µs of this process's CPU per request)."""
    done = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            await one()
            done += 1

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / (time.perf_counter() - t0), (time.process_time() - c0) / max(done, 1) * 1e6


async def measure_h1(url: str, seconds: float) -> tuple[float, float]:
    pool = H1Pool(url.rsplit("/v1/", 1)[0])
    path = "/v1/" + url.rsplit("/v1/", 1)[1]
    try:

        async def one() -> None:
            resp = await pool.post(path, BODY, HEADERS, 1 << 20)
            orjson.loads(resp.body or b"")

        return await _closed_loop(one, seconds)
    finally:
        await pool.aclose()


async def measure_aiohttp(url: str, seconds: float) -> tuple[float, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as resp:
                orjson.loads(await resp.read())

        return await _closed_loop(one, seconds)


async def measure_httpx(url: str, seconds: float) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits) as client:

        async def one() -> None:
            resp = await client.post(url, content=BODY, headers=HEADERS)
            orjson.loads(resp.content)

        return await _closed_loop(one, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=3, help="alternated rounds; medians reported")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "reports")
    args = parser.parse_args(argv)
    two_cpus = (os.cpu_count() or 1) >= 2
    mock = MockProcess.start({1} if two_cpus else None)
    affinity = os.sched_getaffinity(0)
    try:
        if two_cpus:
            os.sched_setaffinity(0, {0})
        url = mock.url + "/v1/chat/completions"
        clients = (("h1 (gateway unary)", measure_h1), ("aiohttp", measure_aiohttp), ("httpx", measure_httpx))
        rounds: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in clients}
        for _name, fn in clients:
            uvloop.run(fn(url, 0.5))  # warm-up
        for _ in range(args.runs):
            for name, fn in clients:
                rounds[name].append(uvloop.run(fn(url, args.seconds)))
    finally:
        os.sched_setaffinity(0, affinity)
        mock.stop()
    results = {name: statistics.median(r for r, _ in runs) for name, runs in rounds.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in rounds.items()}
    report = {
        "machine": machine_info(),
        "concurrency": CONCURRENCY,
        "seconds": args.seconds,
        "runs": args.runs,
        "req_per_s": results,
        "cpu_us_per_request": cpu,
        "rounds": rounds,
        "aiohttp_over_httpx": results["aiohttp"] / results["httpx"],
        "h1_cpu_over_aiohttp": cpu["h1 (gateway unary)"] / cpu["aiohttp"],
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"clients-{stamp}.json").write_text(json.dumps(report, indent=2))
    md = (
        f"| client | req/s (one core, 32 clients, closed loop; medians of {args.runs}) "
        "| CPU µs per request |\n"
        "| --- | --- | --- |\n"
        + "".join(f"| {k} | {v:,.0f} | {cpu[k]:.1f} |\n" for k, v in results.items())
        + f"\nh1 CPU / aiohttp CPU = {report['h1_cpu_over_aiohttp']:.2f}x; "
        f"aiohttp / httpx req/s = {report['aiohttp_over_httpx']:.2f}x\n"
    )
    (args.out / f"clients-{stamp}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
