"""Gateway overhead benchmark: the same load direct to the mock upstream, through a bare
pass-through proxy (the floor) and through the gateway, in the same run.

    python -m load_tests.bench [--quick] [--out DIR] [--runs N] [--direct-only] [--no-floor]
                               [--floor-client aiohttp|h1]

Starts the mock upstream (zero latency), the pass-through floor (``load_tests.bench_floor``,
aiohttp) and ``switchyard serve`` as subprocesses, pins the gateway and the floor to CPU 0 and
the mock plus this load generator to CPU 1, runs each scenario against all three (in turn, so
the floor and the gateway never share their core under load), samples the gateway's RSS idle,
after the load and at its peak, and writes ``bench-<UTC>.json`` and ``.md`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.bench_procs import (
    BenchSetupError,
    FloorProcess,
    GatewayProcess,
    MockProcess,
    cpu_seconds,
    machine_info,
    memory_mb,
)
from load_tests.bench_report import SCENARIO_CHECKS, evaluate, render_markdown
from load_tests.loadgen import LoadSpec, Report, chat_body, run_closed_loop, run_open_loop
from load_tests.mock_upstream import new_event_loop

DEFAULT_OUT = Path(__file__).resolve().parent / "reports"
CACHE_HEADER = "x-switchyard-cache"
IDLE_SETTLE_S = 2.0  # before an RSS sample: let the boot / the last requests' work finish


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    stream: bool = False
    rps: float | None = None
    concurrency: int | None = None
    vary: bool = True
    temperature: float | None = None


SCENARIOS = (
    Scenario("nonstream_open_300", "non-streaming, open loop 300 req/s", rps=300),
    # between the quiet rate and saturation: rows too close for a commit each, too far apart
    # for the writer's group commits to fill (the ledger's commits on the loop pay here)
    Scenario("nonstream_open_1000", "non-streaming, open loop 1,000 req/s", rps=1000),
    Scenario("stream_open_100", "streaming, open loop 100 req/s", stream=True, rps=100),
    Scenario("closed_32_miss", "closed loop 32 clients, cache misses", concurrency=32, temperature=0.0),
    # streamed answers back to back (what coding agents send): the per-chunk relay's cost
    Scenario("closed_32_stream", "closed loop 32 clients, streaming", stream=True, concurrency=32),
    Scenario(
        "closed_32_hit",
        "closed loop 32 clients, exact-cache hits",
        concurrency=32,
        vary=False,
        temperature=0.0,
    ),
)


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    model: str
    headers: dict[str, str]
    pid: int | None = None  # the server process whose CPU each request costs (None: the mock)


@dataclass(frozen=True)
class Durations:
    open_s: float
    closed_s: float
    warmup_s: float

    @classmethod
    def for_mode(cls, quick: bool) -> Durations:
        return cls(3.0, 2.0, 0.3) if quick else cls(10.0, 5.0, 1.0)


def _spec(ep: Endpoint, sc: Scenario, tag: str, duration: float) -> LoadSpec:
    body = chat_body(ep.model, stream=sc.stream, vary=sc.vary, temperature=sc.temperature, tag=tag)
    return LoadSpec(
        url=ep.url + "/v1/chat/completions",
        body=body,
        headers=ep.headers,
        stream=sc.stream,
        duration_s=duration,
        timeout_s=10.0,
        drain_s=5.0,
        count_header=CACHE_HEADER,
    )


async def run_scenario(ep: Endpoint, sc: Scenario, run: int, durations: Durations) -> dict[str, Any]:
    """One measured run (after a warm-up) as a report dict, with ``cpu_us_per_request``: the
    server process's CPU (user + system, from /proc) over the measured part / requests."""
    tag = f"{sc.name}-{run}-{ep.name}-{secrets.token_hex(4)}"
    # identical-request scenarios warm the very request they then measure
    warm = _spec(ep, sc, tag + "-warm" if sc.vary else tag, durations.warmup_s)
    await run_closed_loop(warm, min(sc.concurrency or 8, 32))
    cpu0 = cpu_seconds(ep.pid)
    report: Report
    if sc.rps is not None:
        report = await run_open_loop(_spec(ep, sc, tag, durations.open_s), sc.rps)
    else:
        report = await run_closed_loop(_spec(ep, sc, tag, durations.closed_s), sc.concurrency or 1)
    cpu1 = cpu_seconds(ep.pid)
    out = report.to_dict()
    used = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    out["cpu_us_per_request"] = used / report.count * 1e6 if used is not None and report.count else None
    return out


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of the numbers the table uses; errors and header counts summed."""

    def med(values: list[float | None]) -> float | None:
        xs = [v for v in values if v is not None]
        return statistics.median(xs) if xs else None

    errors: dict[str, int] = {}
    headers: dict[str, int] = {}
    for r in reports:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        for k, v in r["header_counts"].items():
            headers[k] = headers.get(k, 0) + v
    return {
        "latency_p50_ms": med([r["latency_ms"]["p50"] for r in reports]),
        "latency_p99_ms": med([r["latency_ms"]["p99"] for r in reports]),
        "ttft_p50_ms": med([r["ttft_ms"]["p50"] for r in reports]),
        "ttft_p99_ms": med([r["ttft_ms"]["p99"] for r in reports]),
        "rps": med([r["achieved_rps"] for r in reports]),
        "cpu_us_per_request": med([r.get("cpu_us_per_request") for r in reports]),
        "count": sum(r["count"] for r in reports),
        "errors": errors,
        "header_counts": headers,
    }


async def run_all(endpoints: list[Endpoint], runs: int, durations: Durations) -> dict[str, Any]:
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {
        sc.name: {ep.name: [] for ep in endpoints} for sc in SCENARIOS
    }
    for run in range(runs):
        for sc in SCENARIOS:
            for ep in endpoints:
                raw[sc.name][ep.name].append(await run_scenario(ep, sc, run, durations))
    out: dict[str, Any] = {}
    for sc in SCENARIOS:
        entry: dict[str, Any] = {"title": sc.title, "params": sc.__dict__, "runs": raw[sc.name]}
        for name in ("direct", "floor", "gateway"):
            entry[name] = summarize(raw[sc.name][name]) if raw[sc.name].get(name) else None
        out[sc.name] = entry
    return out


def _env_item(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return text


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load_tests.bench", description="gateway overhead benchmark")
    p.add_argument("--quick", action="store_true", help="one short run of each scenario (well under 60 s)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    p.add_argument("--runs", type=int, default=None, help="repetitions (default 3, or 1 with --quick)")
    p.add_argument("--direct-only", action="store_true", help="measure only the mock (no gateway)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--no-floor", action="store_true", help="skip the pass-through floor")
    p.add_argument(
        "--floor-client",
        choices=("aiohttp", "h1"),
        default="aiohttp",
        help="the floor's upstream client for complete requests: aiohttp (the issue's floor) or "
        "h1, the gateway's own (the floor of this design)",
    )
    p.add_argument(
        "--gateway-root",
        type=Path,
        default=None,
        help="run the gateway code of this source tree (e.g. a git worktree of an older commit)",
    )
    p.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        type=_env_item,
        metavar="NAME=VALUE",
        help="extra environment for the gateway, e.g. SWITCHYARD_FASTPATH=0 (repeatable)",
    )
    return p.parse_args(argv)


def _cpu_plan(no_pin: bool) -> tuple[set[int] | None, set[int] | None]:
    cpus = sorted(os.sched_getaffinity(0))
    if no_pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    runs = max(1, min(args.runs or (1 if args.quick else 3), 10))
    durations = Durations.for_mode(args.quick)
    gw_cpus, load_cpus = _cpu_plan(args.no_pin)
    machine = machine_info()
    machine["pinning"] = (
        {"gateway": sorted(gw_cpus), "mock_and_loadgen": sorted(load_cpus)} if gw_cpus and load_cpus else None
    )
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)  # this process (the load generator) and the mock it spawns
    started = time.time()
    gateway_env = dict(item.split("=", 1) for item in args.gateway_env)
    gateway_info: dict[str, Any] = {
        "error": None,
        "env": gateway_env,
        "root": str(args.gateway_root) if args.gateway_root else None,
    }
    mock = MockProcess.start(load_cpus)
    gateway: GatewayProcess | None = None
    floor: FloorProcess | None = None
    memory: dict[str, Any] = {}
    try:
        endpoints = [Endpoint("direct", mock.url, "mock-small", {"authorization": "Bearer mock-key"})]
        if not args.direct_only and not args.no_floor:
            floor = FloorProcess.start(mock.url, gw_cpus, client=args.floor_client)
            auth = {"authorization": "Bearer x"}
            endpoints.append(Endpoint("floor", floor.url, "mock-small", auth, floor.proc.pid))
        with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as home:
            if not args.direct_only:
                try:
                    gateway, key = GatewayProcess.start(
                        Path(home),
                        mock.port,
                        secrets.token_hex(16),
                        gw_cpus,
                        extra_env=gateway_env,
                        root=args.gateway_root,
                    )
                    auth = {"authorization": f"Bearer {key}"}
                    endpoints.append(Endpoint("gateway", gateway.url, "bench", auth, gateway.proc.pid))
                except BenchSetupError as exc:
                    gateway_info["error"] = str(exc)
            if gateway is not None:
                time.sleep(IDLE_SETTLE_S)
                memory["idle"] = memory_mb(gateway.proc.pid)
            loop = new_event_loop()
            try:
                scenarios = loop.run_until_complete(run_all(endpoints, runs, durations))
            finally:
                loop.close()
            if gateway is not None:
                time.sleep(IDLE_SETTLE_S)  # the load is over: what stays is what the gateway keeps
                memory["after_load"] = memory_mb(gateway.proc.pid)
                memory["exact_cache_mb"] = exact_cache_mb(gateway.url)
                gateway_info["log_tail"] = gateway.log_tail(1000)
            if floor is not None:
                memory["floor_after_load"] = memory_mb(floor.proc.pid)
    finally:
        if gateway is not None:
            gateway.stop()
        if floor is not None:
            floor.stop()
        mock.stop()
    report = {
        "kind": "switchyard-bench",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "quick": bool(args.quick),
        "runs": runs,
        "durations": durations.__dict__,
        "elapsed_s": round(time.time() - started, 1),
        "machine": machine,
        "floor_client": None if args.no_floor or args.direct_only else args.floor_client,
        "gateway": gateway_info,
        "scenarios": scenarios,
        "memory": memory_summary(memory),
    }
    report["rows"], report["pass"] = evaluate(scenarios, memory_summary(memory))
    status = 0 if gateway is not None or args.direct_only else 2
    return report, status


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path, str]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = report["timestamp"].replace("-", "").replace(":", "")
    json_path = out / f"bench-{stamp}.json"
    md_path = out / f"bench-{stamp}.md"
    markdown = render_markdown(report)
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path, markdown


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    report, status = bench(args)
    json_path, md_path, markdown = write_report(report, args.out)
    print(markdown)
    print(f"wrote {json_path} and {md_path}")
    if report["gateway"]["error"]:
        print(f"gateway unavailable: {report['gateway']['error']}", file=sys.stderr)
    return status


def exact_cache_mb(url: str) -> float | None:
    """What the gateway's in-process exact cache holds (``switchyard_exact_cache_bytes``), MB."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5.0) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    for line in text.splitlines():
        if line.startswith("switchyard_exact_cache_bytes"):
            return round(float(line.rsplit(" ", 1)[1]) / 1e6, 1)
    return None


def memory_summary(samples: dict[str, Any]) -> dict[str, Any]:
    """The gateway's RSS idle (after boot), after the load (once quiet) and its peak (VmHWM),
    in MB, and the after/idle ratio; the floor's RSS for comparison."""
    idle, after = samples.get("idle"), samples.get("after_load")
    out: dict[str, Any] = {
        "idle_mb": idle["rss_mb"] if idle else None,
        "after_load_mb": after["rss_mb"] if after else None,
        "peak_mb": after["peak_mb"] if after else None,
        "floor_mb": (samples.get("floor_after_load") or {}).get("rss_mb"),
        "exact_cache_mb": samples.get("exact_cache_mb"),
    }
    idle_mb, after_mb, cache_mb = out["idle_mb"], out["after_load_mb"], out["exact_cache_mb"]
    out["after_over_idle"] = round(after_mb / idle_mb, 3) if idle_mb and after_mb else None
    # what stays after the load besides the answers the exact cache keeps (bounded by max_bytes)
    out["after_less_cache_mb"] = round(after_mb - cache_mb, 1) if after_mb and cache_mb is not None else None
    out["after_less_cache_over_idle"] = (
        round(out["after_less_cache_mb"] / idle_mb, 3) if idle_mb and out["after_less_cache_mb"] else None
    )
    return out


__all__ = ["SCENARIOS", "SCENARIO_CHECKS", "bench", "main"]

if __name__ == "__main__":
    sys.exit(main())
