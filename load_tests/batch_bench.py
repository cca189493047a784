"""Batch on the self-hosted lane vs interactive latency, in one run.

A ``switchyard serve`` process routes to a vLLM-like engine mock (load_tests/mock_engine.py)
whose /metrics the gateway probes. Interactive chat requests arrive open-loop at ``--rate``
per second: first alone (phase A, ``--phase-s`` seconds), then while a ``--items`` batch runs
on the route's ``self_hosted`` lane (phase B, same length, same rate). The report gives both
phases' latency percentiles, the p99 rise, and the batch's progress and throughput; the run
is bounded by ``--max-s`` (the batch need not finish inside it: the items done are reported).

    python -m load_tests.batch_bench --items 10000 --out load_tests/batch_bench

writes ``<out>.json`` and ``<out>.md``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from load_tests.bench_procs import GatewayProcess, stop_process

ADMIN = "sy-admin-batch-bench-0123456789"
POLICY = """\
server:
  auth: keys
providers:
  engine:
    type: openai
    base_url: {engine_url}
    key_required: false
    self_hosted: true
    load: {{probe_interval_s: {probe_s}, probe_timeout_s: 0.5}}
models:
  llama:
    provider: engine
    upstream: mock
    price: {{input: 0.02, output: 0.02}}
routes:
  chat:
    targets: [llama]
    cache: {{mode: "off"}}
    batch: {{lane: self_hosted, concurrency: {concurrency}, yield_above: {yield_above},
             max_waiting: 0, max_kv_usage: {max_kv}}}
batches:
  poll_interval_s: 0.02
  max_items: 100000
"""


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def _summary(lat: list[float], errors: int) -> dict[str, Any]:
    return {
        "requests": len(lat),
        "errors": errors,
        "p50_ms": round(_pct(lat, 0.50), 2),
        "p95_ms": round(_pct(lat, 0.95), 2),
        "p99_ms": round(_pct(lat, 0.99), 2),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
    }


async def _interactive(
    session: aiohttp.ClientSession, url: str, rate: float, seconds: float
) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0

    async def one(i: int) -> None:
        nonlocal errors
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"interactive {i}"}],
            "max_tokens": 16,
        }
        t = time.perf_counter()
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    return
        except aiohttp.ClientError:
            errors += 1
            return
        lat.append(time.perf_counter() - t)

    tasks = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return _summary(lat, errors)


async def _batch(session: aiohttp.ClientSession, url: str, items: int) -> str:
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"b{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "chat",
                    "messages": [{"role": "user", "content": f"batch item {i}"}],
                    "max_tokens": 16,
                },
            }
        ).encode()
        + b"\n"
        for i in range(items)
    )
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", lines, filename="batch.jsonl", content_type="application/jsonl")
    async with session.post(url + "/v1/files", data=form) as r:
        assert r.status == 200, await r.text()
        file_id = (await r.json())["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with session.post(url + "/v1/batches", json=body) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["id"])


async def _status(session: aiohttp.ClientSession, url: str, batch_id: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/batches/{batch_id}") as r:
        data: dict[str, Any] = await r.json()
        return data


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[str]:
    """The engine mock in its own process (it must not share a GIL with the load generator)."""
    cmd = [
        sys.executable,
        "-m",
        "load_tests.mock_engine",
        "--slots",
        str(args.slots),
        "--itl-ms",
        str(args.itl_ms),
        "--contention",
        str(args.contention),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with _engine(args) as engine_url:
        home = Path(tempfile.mkdtemp(prefix="batch-bench-"))
        policy = POLICY.format(
            engine_url=engine_url,
            probe_s=args.probe_s,
            concurrency=args.concurrency,
            yield_above=args.yield_above or "null",
            max_kv=args.max_kv,
        )
        gw, key = GatewayProcess.start(
            home, 0, ADMIN, None, timeout=90, policy_template=policy.replace("{", "{{").replace("}", "}}")
        )
        try:
            conn = aiohttp.TCPConnector(limit=0)
            headers = {"authorization": f"Bearer {key}"}
            async with aiohttp.ClientSession(connector=conn, headers=headers) as s:
                await _interactive(s, gw.url, args.rate, 2.0)  # warm-up (not reported)
                alone = await _interactive(s, gw.url, args.rate, args.phase_s)
                t0 = time.perf_counter()
                batch_id = await _batch(s, gw.url, args.items)
                created_s = time.perf_counter() - t0
                before = await _status(s, gw.url, batch_id)
                during = await _interactive(s, gw.url, args.rate, args.phase_s)
                mid = await _status(s, gw.url, batch_id)
                deadline = t0 + args.max_s
                st = mid
                while st["status"] != "completed" and time.perf_counter() < deadline:
                    await asyncio.sleep(0.25)
                    st = await _status(s, gw.url, batch_id)
                elapsed = time.perf_counter() - t0
                after = await _interactive(s, gw.url, args.rate, args.phase_s)  # the noise floor
        finally:
            gw.stop()
    done = st["request_counts"]["completed"]
    base = (alone["p99_ms"] + after["p99_ms"]) / 2
    rise = during["p99_ms"] / base - 1 if base else None
    noise = abs(alone["p99_ms"] - after["p99_ms"]) / base if base else None
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "interactive_alone": alone,
        "interactive_with_batch": during,
        "interactive_alone_after": after,
        "p99_rise": round(rise, 4) if rise is not None else None,
        "p99_noise": round(noise, 4) if noise is not None else None,
        "target_p99_rise": 0.10,
        "batch": {
            "items": args.items,
            "status": st["status"],
            "completed": done,
            "failed": st["request_counts"]["failed"],
            "create_s": round(created_s, 2),
            "completed_at_phase_b_start": before["request_counts"]["completed"],
            "completed_at_phase_b_end": mid["request_counts"]["completed"],
            "elapsed_s": round(elapsed, 1),
            "items_per_s": round(done / elapsed, 1) if elapsed else None,
        },
    }


def markdown(r: dict[str, Any]) -> str:
    a, b, bt, c = r["interactive_alone"], r["interactive_with_batch"], r["batch"], r["config"]
    a2 = r["interactive_alone_after"]
    rows = "\n".join(
        f"| {name} | {x['requests']} | {x['errors']} | {x['p50_ms']} | {x['p95_ms']} | {x['p99_ms']} |"
        for name, x in (("alone, before", a), ("with the batch", b), ("alone, after", a2))
    )
    return f"""# Batch on the self-hosted lane vs interactive latency

Engine mock: {c["slots"]} slots, 16 tokens at {c["itl_ms"]} ms (contention {c["contention"]}); route lane
`self_hosted`, concurrency {c["concurrency"]}, max KV use {c["max_kv"]}, yield_above {c["yield_above"]}.
Interactive load: {c["rate"]} requests/s open loop, {c["phase_s"]} s per phase: alone, while the batch
runs, and alone again once the batch is done (or the run's bound is reached).

| interactive | requests | errors | p50 ms | p95 ms | p99 ms |
| --- | ---: | ---: | ---: | ---: | ---: |
{rows}

p99 rise with the batch over the mean of the two alone phases: **{r["p99_rise"]:.1%}** (target <= 10%);
the two alone phases differ by {r["p99_noise"]:.1%} (the run-to-run noise of this machine).

Batch: {bt["items"]} items, status `{bt["status"]}`, {bt["completed"]} completed and {bt["failed"]} failed in
{bt["elapsed_s"]} s ({bt["items_per_s"]} items/s; created in {bt["create_s"]} s;
{bt["completed_at_phase_b_end"] - bt["completed_at_phase_b_start"]} items ran during phase B).
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=40.0, help="interactive requests per second")
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--max-s", type=float, default=240.0, help="bound on the batch phase")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--itl-ms", type=float, default=2.0)
    p.add_argument("--contention", type=float, default=0.1)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-kv", type=float, default=0.5)
    p.add_argument("--yield-above", type=int, default=2, help="0: never pause for interactive requests")
    p.add_argument("--probe-s", type=float, default=0.1)
    p.add_argument("--out", default="load_tests/batch_bench")
    p.add_argument("--render", action="store_true", help="only write <out>.md again from <out>.json")
    args = p.parse_args(argv)
    if args.render:
        Path(args.out + ".md").write_text(markdown(json.loads(Path(args.out + ".json").read_text())))
        return 0
    result = asyncio.run(run(args))
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
