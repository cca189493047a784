"""Batch on the self-hosted lane vs interactive latency, in one run, phases alternated.

A ``switchyard serve`` process routes to a vLLM-like engine mock (load_tests/mock_engine.py)
whose /metrics the gateway probes. Interactive chat requests arrive open-loop at ``--rate``
per second. One ``--items`` batch is created on the route's ``self_hosted`` lane, paused (the
route's ``batch.concurrency: 0``, applied by a policy reload); then pairs of phases of
``--phase-s`` seconds each alternate: interactive traffic alone (the batch paused), and with
the batch running (concurrency ``--concurrency``), the order flipped every pair (AB BA AB ...)
so a drift of the machine hits both sides alike. Each pair gives the ratio of its two p99s;
the report gives every pair's ratio, their median and spread, and the p99 of all alone and
all with-batch requests pooled. Pairs go on until the batch has completed (at least
``--pairs``, at most ``--max-pairs``); a batch not done then runs on to the end alone, bounded
by ``--max-s``.

    python -m load_tests.batch_bench --items 10000 --out load_tests/batch_bench

writes ``<out>.json`` and ``<out>.md``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
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


async def _interactive(session: aiohttp.ClientSession, url: str, rate: float, seconds: float) -> list[float]:
    """Latencies (s) of ``rate * seconds`` requests sent open loop; an error counts as NaN."""
    lat: list[float] = []

    async def one(i: int) -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": f"interactive {i}"}],
            "max_tokens": 16,
        }
        t = time.perf_counter()
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                ok = r.status == 200
        except aiohttp.ClientError:
            ok = False
        lat.append(time.perf_counter() - t if ok else float("nan"))

    tasks = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return lat


def _summary(lat: list[float]) -> dict[str, Any]:
    ok = [x for x in lat if x == x]
    return {
        "requests": len(lat),
        "errors": len(lat) - len(ok),
        "p50_ms": round(_pct(ok, 0.50), 2),
        "p95_ms": round(_pct(ok, 0.95), 2),
        "p99_ms": round(_pct(ok, 0.99), 2),
        "mean_ms": round(statistics.fmean(ok) * 1000, 2) if ok else None,
    }


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


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
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
        yield f"http://127.0.0.1:{port}/v1", proc.pid
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def _policy(args: argparse.Namespace, engine_url: str, concurrency: int) -> str:
    return POLICY.format(
        engine_url=engine_url,
        probe_s=args.probe_s,
        concurrency=concurrency,
        yield_above=args.yield_above or "null",
        max_kv=args.max_kv,
    )


async def _set_concurrency(gw: GatewayProcess, home: Path, policy: str, settle_s: float) -> None:
    """Rewrite the policy and reload it (SIGHUP): the route's batch runs or pauses (0)."""
    tmp = home / "policy.yaml.tmp"
    tmp.write_text(policy)
    tmp.replace(home / "policy.yaml")
    os.kill(gw.proc.pid, signal.SIGHUP)
    await asyncio.sleep(settle_s)  # the reload, and the items in flight drain (a pause)


def _completed(st: dict[str, Any]) -> int:
    return int(st["request_counts"]["completed"]) + int(st["request_counts"]["failed"])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    pairs: list[dict[str, Any]] = []
    alone_all: list[float] = []
    with_all: list[float] = []
    with _engine(args) as (engine_url, engine_pid):
        home = Path(tempfile.mkdtemp(prefix="batch-bench-"))
        paused, running = _policy(args, engine_url, 0), _policy(args, engine_url, args.concurrency)
        gw, key = GatewayProcess.start(
            home, 0, ADMIN, None, timeout=90, policy_template=paused.replace("{", "{{").replace("}", "}}")
        )
        t_start = time.perf_counter()
        try:
            conn = aiohttp.TCPConnector(limit=0)
            headers = {"authorization": f"Bearer {key}"}
            async with aiohttp.ClientSession(connector=conn, headers=headers) as s:
                await _interactive(s, gw.url, args.rate, 2.0)  # warm-up (not reported)
                t0 = time.perf_counter()
                batch_id = await _batch(s, gw.url, args.items)  # paused: nothing runs yet
                created_s = time.perf_counter() - t0
                st = await _status(s, gw.url, batch_id)
                during_alone = 0
                i = 0
                while i < args.pairs or (st["status"] != "completed" and i < args.max_pairs):
                    order = ("alone", "batch") if i % 2 == 0 else ("batch", "alone")
                    pair: dict[str, Any] = {"order": "".join("A" if o == "alone" else "B" for o in order)}
                    for phase in order:
                        if phase == "batch":
                            await _set_concurrency(gw, home, running, args.settle_s)
                        before = _completed(await _status(s, gw.url, batch_id))
                        cpu = (_cpu_s(gw.proc.pid), _cpu_s(engine_pid))
                        lat = await _interactive(s, gw.url, args.rate, args.phase_s)
                        gw_cpu, engine_cpu = _cpu_s(gw.proc.pid) - cpu[0], _cpu_s(engine_pid) - cpu[1]
                        st = await _status(s, gw.url, batch_id)
                        ran = _completed(st) - before
                        if phase == "batch":
                            await _set_concurrency(gw, home, paused, args.settle_s)
                            with_all += lat
                        else:
                            during_alone += ran
                            alone_all += lat
                        pair[phase] = {
                            **_summary(lat),
                            "batch_items": ran,
                            "gateway_cpu_share": round(gw_cpu / args.phase_s, 3),  # of one core
                            "engine_cpu_share": round(engine_cpu / args.phase_s, 3),
                        }
                    pair["p99_ratio"] = round(pair["batch"]["p99_ms"] / pair["alone"]["p99_ms"], 4)
                    pair["p50_ratio"] = round(pair["batch"]["p50_ms"] / pair["alone"]["p50_ms"], 4)
                    pairs.append(pair)
                    i += 1
                during_batch = _completed(st)
                status_after_pairs = st["status"]
                if st["status"] != "completed":  # the rest runs with no interactive traffic
                    await _set_concurrency(gw, home, running, 0.0)
                    deadline = t_start + args.max_s
                    while st["status"] != "completed" and time.perf_counter() < deadline:
                        await asyncio.sleep(0.25)
                        st = await _status(s, gw.url, batch_id)
                elapsed = time.perf_counter() - t0
        finally:
            gw.stop()
    ratios = sorted(p["p99_ratio"] for p in pairs)
    b_items = sum(p["batch"]["batch_items"] for p in pairs)

    def extra_cpu_ms(proc: str) -> float | None:  # CPU per batch item, over the alone phases'
        extra = sum(p["batch"][f"{proc}_cpu_share"] - p["alone"][f"{proc}_cpu_share"] for p in pairs)
        return round(extra * args.phase_s * 1000 / b_items, 3) if b_items else None

    pooled_alone, pooled_with = _summary(alone_all), _summary(with_all)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "pairs": pairs,
        "p99_ratio_median": round(statistics.median(ratios), 4),
        "p99_ratio_min": ratios[0],
        "p99_ratio_max": ratios[-1],
        "p99_rise_median": round(statistics.median(ratios) - 1, 4),
        "interactive_alone_pooled": pooled_alone,
        "interactive_with_batch_pooled": pooled_with,
        "p99_rise_pooled": round(pooled_with["p99_ms"] / pooled_alone["p99_ms"] - 1, 4),
        "cpu_ms_per_batch_item": {"gateway": extra_cpu_ms("gateway"), "engine_mock": extra_cpu_ms("engine")},
        "cpu_share_mean": {
            f"{proc}_{phase}": round(statistics.fmean(p[phase][f"{proc}_cpu_share"] for p in pairs), 3)
            for proc in ("gateway", "engine")
            for phase in ("alone", "batch")
        },
        "target_p99_rise": 0.10,
        "batch": {
            "items": args.items,
            "status": st["status"],
            "status_after_pairs": status_after_pairs,
            "completed": st["request_counts"]["completed"],
            "failed": st["request_counts"]["failed"],
            "create_s": round(created_s, 2),
            "ran_in_batch_phases": sum(p["batch"]["batch_items"] for p in pairs),
            "ran_in_alone_phases": during_alone,
            "done_when_pairs_ended": during_batch,
            "batch_phase_s": round(len(pairs) * args.phase_s, 1),
            "elapsed_s": round(elapsed, 1),
        },
    }


def markdown(r: dict[str, Any]) -> str:
    c, bt = r["config"], r["batch"]
    rows = "\n".join(
        f"| {i + 1} | {p['order']} | {p['alone']['p50_ms']} / {p['batch']['p50_ms']} | "
        f"{p['alone']['p99_ms']} | {p['batch']['p99_ms']} | {p['p99_ratio']:.3f} | "
        f"{p['batch']['batch_items']} |"
        for i, p in enumerate(r["pairs"])
    )
    a, w = r["interactive_alone_pooled"], r["interactive_with_batch_pooled"]
    cs, cm = r["cpu_share_mean"], r["cpu_ms_per_batch_item"]
    per_s = bt["ran_in_batch_phases"] / bt["batch_phase_s"] if bt["batch_phase_s"] else 0.0
    settle = bt["done_when_pairs_ended"] - bt["ran_in_batch_phases"] - bt["ran_in_alone_phases"]
    after = bt["items"] - bt["done_when_pairs_ended"]
    return f"""# Batch on the self-hosted lane vs interactive latency

Engine mock: {c["slots"]} slots, 16 tokens at {c["itl_ms"]} ms (contention {c["contention"]}); route lane
`self_hosted`, concurrency {c["concurrency"]}, max KV use {c["max_kv"]}, yield_above {c["yield_above"]}.
Interactive load: {c["rate"]} requests/s open loop; pairs of {c["phase_s"]} s phases, alone (A: the batch
paused) and with the batch running (B), order flipped every pair.

| pair | order | p50 ms A / B | p99 ms A | p99 ms B | p99 B/A | batch items in B |
| --- | --- | ---: | ---: | ---: | ---: | ---: |
{rows}

Median p99 ratio with/without the batch: **{r["p99_ratio_median"]:.3f}** (rise {r["p99_rise_median"]:.1%};
target <= 10%), spread over the pairs {r["p99_ratio_min"]:.3f} to {r["p99_ratio_max"]:.3f}. All requests
pooled: p99 {a["p99_ms"]} ms alone ({a["requests"]} requests, {a["errors"]} errors), {w["p99_ms"]} ms with the
batch ({w["requests"]} requests, {w["errors"]} errors): rise {r["p99_rise_pooled"]:.1%}.

Where the batch's cost lands (CPU share of one core, mean over the phases, alone / with the batch):
gateway {cs["gateway_alone"]} / {cs["gateway_batch"]}, engine mock {cs["engine_alone"]} /
{cs["engine_batch"]}; per batch item {cm["gateway"]} ms of gateway CPU and {cm["engine_mock"]} ms of
engine-mock CPU.

Batch: {bt["items"]} items, status `{bt["status"]}` ({bt["completed"]} completed, {bt["failed"]} failed);
{bt["ran_in_batch_phases"]} ran during the {bt["batch_phase_s"]} s of B phases ({per_s:.1f} items/s beside the
interactive traffic), {bt["ran_in_alone_phases"]} during A phases (the pause), {settle} in the unmeasured
seconds around the B phases (resuming, draining) and {after} left after the pairs (run then with no
interactive traffic, as far as `--max-s` allowed); {bt["elapsed_s"]} s from creation to the end.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=40.0, help="interactive requests per second")
    p.add_argument("--phase-s", type=float, default=15.0)
    p.add_argument("--pairs", type=int, default=4, help="alone/with-batch pairs, at least")
    p.add_argument("--max-pairs", type=int, default=24, help="pairs at most (while the batch runs)")
    p.add_argument("--settle-s", type=float, default=1.0, help="after each pause/resume, not measured")
    p.add_argument("--max-s", type=float, default=600.0, help="bound on the whole run")
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
