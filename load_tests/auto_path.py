"""The auto path's cost: the same load on a plain route and on a classifier route with the
semantic cache, through one real gateway and the mock upstream, in the same run.

    python -m load_tests.auto_path [--quick] [--out DIR] [--rps N] [--clients N]

``plain``: one target, exact cache only (temperature 0, every prompt new: misses).
``auto``:  tiers cheap/strong + classifier (quality target 0.95) + semantic cache: each request
           is embedded once (shared with the classifier), looked up, scored and routed.
Open loop at --rps: latency p50/p99 of each route; the difference is what the auto path adds.
Closed loop with --clients: requests/s of each. The gateway runs one worker pinned to CPU 0
(the mock and this load generator to CPU 1) when the machine has 2+ cores. Every prompt is
unique (no exact or semantic hits, the embedder's LRU never answers): the figures are the
full cost of embedding, lookup and scoring. On a shared machine the gateway's own CPU time
per request (``gateway_cpu_ms``, from /proc, all its threads) is the honest figure: CPU 0's
other tenants steal wall time but not CPU time; ``req_per_cpu_s`` = 1000 / that.
Writes auto-path-<UTC>.json and .md under DIR (default load_tests/reports)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from load_tests.bench_procs import MockProcess, machine_info, pin_tree
from load_tests.bench_report import save_report
from load_tests.loadgen import LoadSpec, Report, run_closed_loop, run_open_loop
from load_tests.mock_upstream import new_event_loop
from load_tests.scenarios.served import ServedGateway

DEFAULT_OUT = Path(__file__).resolve().parent / "reports"
TARGETS = {"added_p50_ms": 5.0, "auto_rps": 500.0}

POLICY = """
server: {{auth: keys, max_in_flight: 4096}}
providers:
  mock: {{type: openai, base_url: "{mock_url}/v1", api_key: mock-key}}
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, output: 0.60}}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, output: 10.00}}}}
routes:
  plain:
    targets: [small]
    cache: {{mode: deterministic}}
  auto:
    tiers: {{cheap: [small], strong: [large]}}
    classifier: {{quality_target: 0.95}}
    baseline: large
    cache: {{mode: deterministic}}
    semantic_cache: {{enabled: true}}
"""

SUBJECTS = ("train", "recipe", "loan", "garden", "triangle", "protein", "contract", "poem", "cache", "river")
ASKS = (
    "How many {a} does it take if each {s} needs {b} more than the last one?",
    "Explain in two sentences why a {s} with {a} parts fails under {b} units of load.",
    "What is {a} times {b}, and is the result a prime number?",
    "Write a short note about the {s} we discussed, mentioning {a} and {b}.",
    "Summarise the main risk of a {s} project that is {a} weeks late and {b}% over budget.",
)


def prompt(i: int, seed: int) -> str:
    rng = random.Random(seed * 1_000_003 + i)
    text = rng.choice(ASKS).format(s=rng.choice(SUBJECTS), a=rng.randint(2, 999), b=rng.randint(2, 999))
    return f"{text} (ticket {seed}-{i})"


def body_factory(route: str, seed: int) -> Any:
    def make(i: int) -> bytes:
        body = {"model": route, "temperature": 0, "messages": [{"role": "user", "content": prompt(i, seed)}]}
        return json.dumps(body).encode()

    return make


def reuse_models(home: Path) -> None:
    """Point the gateway at the caller's exported ONNX model, if any (else it exports its own)."""
    if os.environ.get("SWITCHYARD_MODEL_DIR"):  # inherited by the gateway process
        return
    mine = Path(os.environ.get("SWITCHYARD_HOME") or Path.home() / ".switchyard").expanduser() / "models"
    if mine.is_dir():
        home.mkdir(parents=True, exist_ok=True)
        (home / "models").symlink_to(mine.resolve(), target_is_directory=True)


def warm(gw: ServedGateway, timeout: float = 180.0) -> float:
    """First auto request (loads the embedder; the first start ever also exports the ONNX model)."""
    t0 = time.perf_counter()
    data = body_factory("auto", 999_999)(0)
    req = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=data,
        headers={**gw.headers(), "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()
    return time.perf_counter() - t0


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (all threads), from /proc."""
    total, todo, seen = 0.0, [pid], set()
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        try:
            fields = Path(f"/proc/{cur}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for tid in os.listdir(f"/proc/{cur}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{cur}/task/{tid}/children").read_text().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


async def one(gw: ServedGateway, route: str, mode: str, arg: float, seconds: float, seed: int) -> Report:
    spec = LoadSpec(
        url=gw.url + "/v1/chat/completions",
        body=body_factory(route, seed),
        headers=gw.headers(),
        duration_s=seconds,
        count_header="x-switchyard-model",
    )
    if mode == "open":
        return await run_open_loop(spec, arg)
    return await run_closed_loop(spec, int(arg))


async def measure(gw: ServedGateway, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seed = 1
    for run in range(args.runs):
        for mode, arg in (("open", args.rps), ("closed", args.clients)):
            for route in ("plain", "auto"):  # interleaved, so drift hits both alike
                seed += 1
                cpu0 = tree_cpu_s(gw.pid)
                rep = await one(gw, route, mode, arg, args.seconds, seed)
                cpu_ms = (tree_cpu_s(gw.pid) - cpu0) * 1000 / max(rep.ok, 1)
                out.setdefault(f"{mode}/{route}", []).append({**rep.to_dict(), "gateway_cpu_ms": cpu_ms})
                print(f"run {run + 1} {mode:6s} {route:5s} {rep.achieved_rps:8.1f} req/s "
                      f"p50 {rep.latency_ms['p50']} ms gateway CPU {cpu_ms:.2f} ms/req "
                      f"errors {rep.errors}", file=sys.stderr)  # fmt: skip
    return out


def _median(xs: list[float | None]) -> float | None:
    vals = sorted(x for x in xs if x is not None)
    return vals[len(vals) // 2] if vals else None


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    def lat(key: str, q: str) -> float | None:
        return _median([r["latency_ms"][q] for r in raw[key]])

    def rps(key: str) -> float | None:
        return _median([r["achieved_rps"] for r in raw[key]])

    p50_plain, p50_auto = lat("open/plain", "p50"), lat("open/auto", "p50")
    p99_plain, p99_auto = lat("open/plain", "p99"), lat("open/auto", "p99")
    added = None if p50_plain is None or p50_auto is None else p50_auto - p50_plain
    auto_rps = rps("closed/auto")
    cpu = {k: _median([r.get("gateway_cpu_ms") for r in raw[k]]) for k in ("closed/plain", "closed/auto")}
    per_cpu_s = {k.split("/")[1]: (None if v is None else 1000 / v) for k, v in cpu.items() if v}
    return {
        "open_p50_ms": {"plain": p50_plain, "auto": p50_auto, "added": added},
        "open_p99_ms": {"plain": p99_plain, "auto": p99_auto},
        "closed_rps": {"plain": rps("closed/plain"), "auto": auto_rps},
        "closed_gateway_cpu_ms": {k.split("/")[1]: v for k, v in cpu.items()},
        "closed_req_per_cpu_s": per_cpu_s,
        "auto_models": _models(raw["open/auto"] + raw["closed/auto"]),
        "errors": {k: sum(sum(r["errors"].values()) for r in v) for k, v in raw.items()},
        "targets": TARGETS,
        "meets": {
            "added_p50_ms": added is not None and added <= TARGETS["added_p50_ms"],
            "auto_rps": auto_rps is not None and auto_rps >= TARGETS["auto_rps"],
        },
    }


def _models(reports: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in reports:
        for k, v in r["header_counts"].items():
            counts[k] = counts.get(k, 0) + v
    return counts


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [
        f"# Auto path vs plain route ({report['started']})",
        "",
        f"Machine: {report['machine']}. Gateway: 1 worker{', pinned to CPU 0' if report['pinned'] else ''}; "
        f"embedder warm-up (first auto request) {report['warm_s']:.1f} s. "
        f"Medians of {report['runs']} run(s), {report['seconds']} s each.",
        "",
        "| measure | plain | auto | added / ratio | target |",
        "| --- | --- | --- | --- | --- |",
        f"| open loop {report['rps']} req/s, latency p50 (ms) | {f(s['open_p50_ms']['plain'])} | "
        f"{f(s['open_p50_ms']['auto'])} | +{f(s['open_p50_ms']['added'])} ms | "
        f"<= {TARGETS['added_p50_ms']} ms |",
        f"| open loop {report['rps']} req/s, latency p99 (ms) | {f(s['open_p99_ms']['plain'])} | "
        f"{f(s['open_p99_ms']['auto'])} | | |",
        f"| closed loop {report['clients']} clients (req/s) | {f(s['closed_rps']['plain'])} | "
        f"{f(s['closed_rps']['auto'])} | | auto >= {TARGETS['auto_rps']:.0f} req/s |",
        f"| closed loop: gateway CPU per request (ms) | {f(s['closed_gateway_cpu_ms'].get('plain'))} | "
        f"{f(s['closed_gateway_cpu_ms'].get('auto'))} | | |",
        f"| closed loop: requests per gateway CPU-second | {f(s['closed_req_per_cpu_s'].get('plain'))} | "
        f"{f(s['closed_req_per_cpu_s'].get('auto'))} | | auto >= {TARGETS['auto_rps']:.0f} |",
        "",
        f"Auto route served by: {s['auto_models']}. Errors: {s['errors']}.",
        f"Targets met: {s['meets']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.auto_path", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 s per measure, 1 run unless --runs")
    p.add_argument("--runs", type=int, default=None, help="repetitions (default 3, or 1 with --quick)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rps", type=float, default=100.0, help="open-loop rate")
    p.add_argument("--clients", type=int, default=32, help="closed-loop concurrency")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.quick:
        args.seconds = 3.0
    pinned = (os.cpu_count() or 1) >= 2
    mock = MockProcess.start({1} if pinned else None)
    if pinned:
        os.sched_setaffinity(0, {1})
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        with tempfile.TemporaryDirectory(prefix="sy-autopath-") as tmp:
            home = Path(tmp) / "home"
            reuse_models(home)
            gw = ServedGateway(home, POLICY.format(mock_url=mock.url), args=["--workers", "1"])
            with gw:
                if pinned:
                    pin_tree(gw.pid, {0})
                warm_s = warm(gw)
                loop = new_event_loop()
                try:
                    raw = loop.run_until_complete(measure(gw, args))
                finally:
                    loop.close()
    finally:
        mock.stop()
    report = {
        "started": started,
        "machine": machine_info(),
        "pinned": pinned,
        "runs": args.runs,
        "seconds": args.seconds,
        "rps": args.rps,
        "clients": args.clients,
        "warm_s": warm_s,
        "summary": summarise(raw),
        "raw": raw,
    }
    stem = args.out / f"auto-path-{started.replace(':', '')}"
    save_report(stem, report, markdown(report))
    print(markdown(report))
    print(f"wrote {stem}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
