"""Which HTTP client should the gateway use upstream? Measure, don't guess.

`python -m load_tests.client_compare [--seconds 4] [--out DIR]` starts the mock upstream
(pinned to CPU 1), then drives it from this process (pinned to CPU 0) with 32 concurrent
clients in a closed loop, once with aiohttp (the gateway's choice) and once with httpx (via
httpx2, what the openai SDK uses), each doing what the gateway does per request: POST a JSON
body, read the whole answer, parse it. Writes JSON and Markdown to DIR."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import httpx2 as httpx
import orjson

from load_tests.bench_procs import MockProcess, machine_info

BODY = orjson.dumps({"model": "mock-small", "messages": [{"role": "user", "content": "hello"}]})
HEADERS = {"content-type": "application/json", "authorization": "Bearer mock-key"}
CONCURRENCY = 32


async def _closed_loop(one: Callable[[], Awaitable[None]], seconds: float) -> float:
    done = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            await one()
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / (time.perf_counter() - t0)


async def measure_aiohttp(url: str, seconds: float) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            async with session.post(url, data=BODY, headers=HEADERS) as resp:
                orjson.loads(await resp.read())

        return await _closed_loop(one, seconds)


async def measure_httpx(url: str, seconds: float) -> float:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits) as client:

        async def one() -> None:
            resp = await client.post(url, content=BODY, headers=HEADERS)
            orjson.loads(resp.content)

        return await _closed_loop(one, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "reports")
    args = parser.parse_args(argv)
    two_cpus = (os.cpu_count() or 1) >= 2
    mock = MockProcess.start({1} if two_cpus else None)
    affinity = os.sched_getaffinity(0)
    try:
        if two_cpus:
            os.sched_setaffinity(0, {0})
        url = mock.url + "/v1/chat/completions"
        results = {}
        for name, fn in (("aiohttp", measure_aiohttp), ("httpx", measure_httpx)):
            asyncio.run(fn(url, 0.5))  # warm-up
            results[name] = asyncio.run(fn(url, args.seconds))
    finally:
        os.sched_setaffinity(0, affinity)
        mock.stop()
    report = {
        "machine": machine_info(),
        "concurrency": CONCURRENCY,
        "seconds": args.seconds,
        "req_per_s": results,
        "aiohttp_over_httpx": results["aiohttp"] / results["httpx"],
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"clients-{stamp}.json").write_text(json.dumps(report, indent=2))
    md = (
        "| client | req/s (one core, 32 clients, closed loop) |\n| --- | --- |\n"
        + "".join(f"| {k} | {v:,.0f} |\n" for k, v in results.items())
        + f"\naiohttp / httpx = {report['aiohttp_over_httpx']:.2f}x\n"
    )
    (args.out / f"clients-{stamp}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
