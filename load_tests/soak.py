"""Soak test: a steady open-loop rate for N minutes through a real gateway with streaming and the
exact cache on, sampling the gateway's RSS and open file descriptors.

    python -m load_tests.soak --minutes 10 [--rps 60] [--sample-s 2] [--out DIR]

Traffic: half the requests stream, half do not; three in four draw their prompt from a pool of
100 (temperature 0: exact-cache hits once seen), one in four is unique (misses). The exact cache
is bounded at 256 KiB, so it is full before warm-up ends and its growth is not mistaken for a leak
(the unbounded default of 256 MiB would fill at about 1.5 KiB per unique answer). The mock
upstream runs as its own process with a little latency. After a warm-up (20% of the run, at
least 10 s), RSS growth is the median RSS of the last tenth of the run against the median of
the first tenth after warm-up. File descriptors are compared at quiet points (load stopped,
6 s settle) after warm-up and at the end, by kind: non-socket fds must not grow and no socket
may be stuck in CLOSE_WAIT; ESTABLISHED sockets then are the upstream keep-alive pool.
Writes soak-<UTC>.json, .md and .png (the RSS and fd curves) under DIR (default
load_tests/reports)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from load_tests.bench_procs import MockProcess, machine_info
from load_tests.loadgen import LoadSpec, Report, run_open_loop
from load_tests.mock_upstream import new_event_loop
from load_tests.scenarios.served import ServedGateway, scenario_policy

DEFAULT_OUT = Path(__file__).resolve().parent / "reports"
SEGMENT_S = 60.0  # the load runs in segments (connections are closed and reopened between them)
RSS_LIMIT = 0.10
POOL = 100
QUIET_S = 6.0
CACHE_BYTES = 256 * 1024


def body_factory(stream: bool, tag: str) -> Any:
    def make(i: int) -> bytes:
        text = f"soak unique {tag} {i}" if i % 4 == 0 else f"soak pooled {(i * 7919) % POOL}"
        body: dict[str, Any] = {
            "model": "auto",
            "temperature": 0,
            "messages": [{"role": "user", "content": text}],
        }
        if stream:
            body["stream"] = True
        return json.dumps(body).encode()

    return make


async def _segment(gw: ServedGateway, rps: float, seconds: float, tag: str) -> list[Report]:
    url = gw.url + "/v1/chat/completions"
    specs = [
        LoadSpec(
            url=url,
            body=body_factory(stream, tag),
            headers=gw.headers(),
            stream=stream,
            duration_s=seconds,
            timeout_s=30.0,
            count_header="x-switchyard-cache",
        )
        for stream in (False, True)
    ]
    return list(await asyncio.gather(*(run_open_loop(s, rps / 2) for s in specs)))


class Sampler(threading.Thread):
    def __init__(self, gw: ServedGateway, every_s: float) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.gw, self.every_s = gw, every_s
        self.samples: list[dict[str, float]] = []
        self.t0 = time.monotonic()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append(
                {
                    "t_s": round(time.monotonic() - self.t0, 2),
                    "rss_kib": self.gw.rss_kib(),
                    "fds": self.gw.open_fds(),
                }
            )
            self.stop_event.wait(self.every_s)


def _quiet_point(gw: ServedGateway) -> dict[str, Any]:
    """Load stopped; past the server's keep-alive timeout (5 s) the clients' connections are gone."""
    time.sleep(QUIET_S)
    return {"rss_kib": gw.rss_kib(), "fds": gw.open_fds(), "census": gw.fd_census()}


def fd_growth(before: dict[str, int], after: dict[str, int]) -> int:
    """Descriptors that can only be leaks: more non-socket fds, sockets left in CLOSE_WAIT or in
    any state but ESTABLISHED/LISTEN. (ESTABLISHED sockets at a quiet point are the upstream
    keep-alive pool, whose size follows the peak concurrency, not the number of requests.)"""
    other = after.get("other", 0) - before.get("other", 0)
    stuck = sum(v for k, v in after.items() if k in ("close_wait", "tcp_other"))
    unaccounted = after.get("sockets", 0) - sum(
        after.get(k, 0) for k in ("established", "listen", "time_wait", "close_wait", "tcp_other")
    )
    before_unaccounted = before.get("sockets", 0) - sum(
        before.get(k, 0) for k in ("established", "listen", "time_wait", "close_wait", "tcp_other")
    )
    return max(0, other) + stuck + max(0, unaccounted - before_unaccounted)


def _merge(reports: list[Report]) -> dict[str, Any]:
    errors: dict[str, int] = {}
    cache: dict[str, int] = {}
    for r in reports:
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
        for k, v in r.header_counts.items():
            cache[k] = cache.get(k, 0) + v
    return {
        "requests": sum(r.count for r in reports),
        "ok": sum(r.ok for r in reports),
        "errors": errors,
        "cache": cache,
        "cancelled": sum(r.cancelled for r in reports),
    }


def _window(samples: list[dict[str, float]], start: float, end: float) -> list[float]:
    return [s["rss_kib"] for s in samples if start <= s["t_s"] <= end]


def run_soak(
    minutes: float, rps: float, sample_s: float, workdir: Path, *, ttft_ms: float = 5, itl_ms: float = 2
) -> dict[str, Any]:
    total_s = minutes * 60.0
    warmup_s = max(10.0, 0.2 * total_s)
    main_s = max(10.0, total_s - warmup_s)
    mock = MockProcess.start(None)
    try:
        config = json.dumps({"ttft_ms": ttft_ms, "itl_ms": itl_ms, "tokens": 16}).encode()
        urllib.request.urlopen(
            urllib.request.Request(mock.url + "/_mock/config", data=config, method="POST"), timeout=5
        ).close()
        # The exact cache is bounded small so that it is full (steady) before warm-up ends: the
        # RSS curve then shows leaks, not the cache filling up to its configured bound.
        policy = scenario_policy(mock.url, f"cache: {{backend: memory, max_bytes: {CACHE_BYTES}}}")
        policy = policy.replace("cache: {mode: deterministic}", "cache: {mode: always}")
        with ServedGateway(workdir, policy, args=["--log-level", "warning"]) as gw:
            gw.key()
            loop = new_event_loop()
            try:
                start_quiet = {"rss_kib": gw.rss_kib(), "fds": gw.open_fds()}
                sampler = Sampler(gw, sample_s)
                sampler.start()
                warm = loop.run_until_complete(_segment(gw, rps, warmup_s, "warmup"))
                after_warmup = _quiet_point(gw)
                main_start = time.monotonic() - sampler.t0
                reports: list[Report] = []
                left, seg = main_s, 0
                while left > 0:
                    seconds = min(SEGMENT_S, left)
                    reports += loop.run_until_complete(_segment(gw, rps, seconds, f"s{seg}"))
                    left -= seconds
                    seg += 1
                main_end = time.monotonic() - sampler.t0
                end_quiet = _quiet_point(gw)
                sampler.stop_event.set()
                sampler.join(5)
            finally:
                loop.close()
            sent = _merge(warm + reports)
            rows = gw.wait_rows(sent["ok"], timeout=20)
    finally:
        mock.stop()
    samples = sampler.samples
    tenth = max(sample_s, (main_end - main_start) / 10)
    first = _window(samples, main_start, main_start + tenth)
    last = _window(samples, main_end - tenth, main_end)
    rss_first = statistics.median(first) if first else after_warmup["rss_kib"]
    rss_last = statistics.median(last) if last else end_quiet["rss_kib"]
    growth = (rss_last - rss_first) / rss_first if rss_first else 0.0
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {
        "minutes": minutes,
        "rps": rps,
        "warmup_s": warmup_s,
        "main_s": main_s,
        "sample_s": sample_s,
        "load": sent,
        "main_phase": _merge(reports),
        "ledger_rows": len(rows),
        "ledger_statuses": statuses,
        "rows_lost": max(0, sent["ok"] - len(rows)),
        "rss_start_kib": start_quiet["rss_kib"],
        "rss_after_warmup_kib": rss_first,
        "rss_end_kib": rss_last,
        "rss_growth": round(growth, 4),
        "rss_growth_ok": growth < RSS_LIMIT,
        "fds_start": start_quiet["fds"],
        "fds_after_warmup_quiet": after_warmup["fds"],
        "fds_end_quiet": end_quiet["fds"],
        "fd_growth": fd_growth(after_warmup["census"], end_quiet["census"]),
        "fd_census_after_warmup": after_warmup["census"],
        "fd_census_end": end_quiet["census"],
        "rss_end_quiet_kib": end_quiet["rss_kib"],
        "main_start_s": round(main_start, 2),
        "main_end_s": round(main_end, 2),
        "samples": samples,
    }


def render_markdown(result: dict[str, Any], machine: dict[str, Any], png: str | None) -> str:
    load = result["load"]
    lines = [
        f"# Soak: {result['minutes']:g} min at {result['rps']:g} req/s",
        "",
        f"Machine: {machine['nproc']} cores, {machine['cpu_model']}, Python {machine['python']}, "
        f"load average at start {machine.get('loadavg_at_start')}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| requests sent / ok | {load['requests']} / {load['ok']} |",
        f"| errors | {load['errors'] or 'none'} |",
        f"| cache (x-switchyard-cache) | {load['cache']} |",
        f"| ledger rows / lost | {result['ledger_rows']} / {result['rows_lost']} |",
        f"| warm-up | {result['warmup_s']:.0f} s |",
        f"| RSS after warm-up -> end (medians) | {result['rss_after_warmup_kib'] / 1024:.1f} MiB -> "
        f"{result['rss_end_kib'] / 1024:.1f} MiB |",
        f"| RSS growth after warm-up | {result['rss_growth'] * 100:.2f}% (limit {RSS_LIMIT * 100:.0f}%) |",
        f"| open fds, quiet after warm-up -> quiet at end | {result['fds_after_warmup_quiet']} -> "
        f"{result['fds_end_quiet']} |",
        f"| fds by kind at those points | {result['fd_census_after_warmup']} -> {result['fd_census_end']} |",
        f"| leaked fds (non-socket growth, CLOSE_WAIT, unaccounted sockets) | {result['fd_growth']} |",
    ]
    if png:
        lines += ["", f"![RSS and open file descriptors over time]({png})"]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    samples = result["samples"]
    t = [s["t_s"] for s in samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot(t, [s["rss_kib"] / 1024 for s in samples], color="tab:blue")
    ax1.set_ylabel("RSS (MiB)")
    ax1.set_ylim(bottom=0)
    ax2.plot(t, [s["fds"] for s in samples], color="tab:orange")
    ax2.set_ylabel("open fds")
    ax2.set_xlabel("seconds")
    for ax in (ax1, ax2):
        ax.axvspan(0, result["main_start_s"], color="grey", alpha=0.15, label="warm-up")
        ax.grid(alpha=0.3)
    ax1.legend(loc="lower right")
    fig.suptitle(
        f"Switchyard soak: {result['rps']:g} req/s, RSS growth {result['rss_growth'] * 100:.2f}%, "
        f"fd growth {result['fd_growth']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_reports(result: dict[str, Any], out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    machine = machine_info()
    base = out / f"soak-{stamp}"
    png = base.with_suffix(".png")
    has_png = plot(result, png)
    base.with_suffix(".json").write_text(json.dumps({"machine": machine, **result}, indent=2))
    base.with_suffix(".md").write_text(render_markdown(result, machine, png.name if has_png else None))
    paths = {"json": str(base.with_suffix(".json")), "md": str(base.with_suffix(".md"))}
    if has_png:
        paths["png"] = str(png)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rps", type=float, default=60.0)
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="switchyard-soak-") as tmp:
        result = run_soak(args.minutes, args.rps, args.sample_s, Path(tmp))
    paths = write_reports(result, args.out)
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps({**summary, "reports": paths}, indent=2))
    ok = result["rss_growth_ok"] and result["fd_growth"] <= 0 and result["rows_lost"] == 0
    return 0 if ok and not result["load"]["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
