"""Where a miss's CPU goes: the gateway with its features switched off one at a time.

``python -m load_tests.bench_itemize [--runs 3] [--seconds 4] [--out DIR]``

The closed loop of ``load_tests.bench`` (32 clients, distinct prompts: every request a cache
miss through to the zero-latency mock) against, in turn and alternated ``--runs`` times, the
full gateway and variants without auth (``server.auth: none``), without the exact cache
(``cache.mode: off`` on the route), without the ledger (``SWITCHYARD_LEDGER=none``), without
all three, and the bare aiohttp pass-through floor (``bench_floor``), each on the same pinned
core. Reports each one's server CPU per request (user + system from /proc over the measured
part) and req/s, medians of the runs; the difference to the full gateway is what that feature
costs. JSON + Markdown to ``load_tests/reports/itemize-*``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from load_tests.bench_procs import (
    POLICY_TEMPLATE,
    FloorProcess,
    GatewayProcess,
    MockProcess,
    cpu_seconds,
    machine_info,
    stop_process,
)
from load_tests.loadgen import LoadSpec, chat_body, run_closed_loop
from load_tests.report_files import bench_parser, save_report

NO_AUTH = POLICY_TEMPLATE.replace("  auth: keys\n", "  auth: none\n")
CACHE_OFF = '    targets: [mock-small]\n    cache: {{mode: "off"}}\n'  # quoted: YAML reads off as false
TARGETS = "    targets: [mock-small]\n"
NO_CACHE = POLICY_TEMPLATE.replace(TARGETS, CACHE_OFF)


@dataclass(frozen=True)
class Variant:
    name: str
    policy: str | None = POLICY_TEMPLATE  # None: the pass-through floor
    env: tuple[tuple[str, str], ...] = ()


LEDGER_OFF = (("SWITCHYARD_LEDGER", "none"),)
VARIANTS = (
    Variant("gateway, everything on"),
    Variant("no auth", NO_AUTH),
    Variant("no exact cache", NO_CACHE),
    Variant("no ledger", env=LEDGER_OFF),
    Variant("no auth, cache or ledger", NO_AUTH.replace(TARGETS, CACHE_OFF), LEDGER_OFF),
    Variant("pass-through floor", None),
)  # fmt: skip


async def closed_loop_cpu(
    url: str, headers: dict[str, str], model: str, seconds: float, pid: int
) -> dict[str, float]:
    """32 clients in a closed loop of distinct prompts (after a 1 s warm-up) against ``url``:
    req/s and the server ``pid``'s CPU per request (µs)."""
    tag = secrets.token_hex(4)

    def spec(duration: float, run: str) -> LoadSpec:
        body = chat_body(model, stream=False, vary=True, temperature=0.0, tag=f"{tag}-{run}")
        return LoadSpec(url=url + "/v1/chat/completions", body=body, headers=headers, stream=False,
                        duration_s=duration, timeout_s=10.0, drain_s=5.0)  # fmt: skip

    await run_closed_loop(spec(1.0, "warm"), 32)
    cpu0 = cpu_seconds(pid)
    report = await run_closed_loop(spec(seconds, "run"), 32)
    cpu1 = cpu_seconds(pid)
    if report.errors or cpu0 is None or cpu1 is None or not report.count:
        raise RuntimeError(f"bad run: {report.errors} ({report.count} requests)")
    return {"rps": report.achieved_rps, "cpu_us": (cpu1 - cpu0) / report.count * 1e6}


def run_variant(v: Variant, mock: MockProcess, seconds: float) -> dict[str, float]:
    if v.policy is None:
        floor = FloorProcess.start(mock.url, {0})
        try:
            auth = {"authorization": "Bearer x"}
            return asyncio.run(closed_loop_cpu(floor.url, auth, "mock-small", seconds, floor.proc.pid))
        finally:
            floor.stop()
    with tempfile.TemporaryDirectory(prefix="sy-itemize-") as home:
        gw, key = GatewayProcess.start(
            Path(home), mock.port, secrets.token_hex(16), {0}, extra_env=dict(v.env), policy_template=v.policy
        )
        try:
            auth = {"authorization": f"Bearer {key}"}
            return asyncio.run(closed_loop_cpu(gw.url, auth, "bench", seconds, gw.proc.pid))
        finally:
            gw.stop()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {1})  # the load generator and the mock; servers on CPU 0
    machine = machine_info()
    mock = MockProcess.start({1})
    results: dict[str, list[dict[str, float]]] = {v.name: [] for v in VARIANTS}
    try:
        for _ in range(max(1, args.runs)):
            for v in VARIANTS:
                results[v.name].append(run_variant(v, mock, args.seconds))
    finally:
        stop_process(mock.proc)
    med = {
        n: {k: statistics.median(r[k] for r in rs) for k in ("rps", "cpu_us")} for n, rs in results.items()
    }
    full = med[VARIANTS[0].name]["cpu_us"]
    floor = med["pass-through floor"]["rps"]
    lines = [
        f"# Where a miss's CPU goes ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, "
        f"medians of {args.runs})",
        "",
        f"Load average at start {machine['loadavg_at_start']}; closed loop, 32 clients, distinct prompts "
        "(all misses), zero-latency mock; servers pinned to CPU 0.",
        "",
        "| variant | req/s | / floor | server CPU per request | vs everything on |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, m in med.items():
        lines.append(
            f"| {name} | {m['rps']:,.0f} | x{m['rps'] / floor:.2f} | {m['cpu_us']:,.0f} µs "
            f"| {m['cpu_us'] - full:+,.0f} µs |"
        )
    payload = {"machine": machine, "runs": results, "medians": med}
    save_report(args.out, "itemize", payload, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
