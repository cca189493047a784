"""Where the gateway's memory goes under load: a tracemalloc snapshot diff inside a gateway.

    python -m load_tests.mem_profile [--requests 30000] [--mix miss,hit,stream] [--out DIR]

Runs the benchmark's policy (auth, exact cache in memory, SQLite ledger, metrics) in this
process (uvicorn in a thread, as the tests do) with ``tracemalloc`` on, drives it from
``load_tests.loadgen`` subprocesses (so the load generator's own allocations do not count),
then reports RSS idle / after load / after ``malloc_trim(0)`` and peak, the exact cache's
size, and the allocation sites that grew most between the idle and the after-load snapshots
(``mem-<UTC>.json`` and ``.md``). tracemalloc itself slows the gateway and adds to RSS:
use ``load_tests.bench`` for the RSS figures, this for the "where"."""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from load_tests.bench_procs import POLICY_TEMPLATE, MockProcess, env_with_root, free_port, memory_mb
from load_tests.bench_report import save_report

DEFAULT_OUT = Path(__file__).resolve().parent / "reports"


def malloc_trim() -> bool:
    """Give glibc's free heap pages back to the OS (False where there is no glibc)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _load(url: str, key: str, mode: str, requests: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "load_tests.loadgen", "--url", url, "--mode", "closed"]
    cmd += ["--concurrency", "32", "--duration", "600", "--max-requests", str(requests)]
    cmd += ["--model", "bench", "--header", f"Authorization: Bearer {key}", "--temperature", "0"]
    cmd += {"miss": ["--vary"], "hit": [], "stream": ["--vary", "--stream"]}[mode]
    out = subprocess.run(cmd, env=env_with_root(), capture_output=True, text=True, timeout=900, check=False)
    try:
        report: dict[str, Any] = json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"error": (out.stderr or out.stdout)[-500:]}
    return {k: report.get(k) for k in ("count", "ok", "errors", "achieved_rps")}


def profile(requests: int, mix: list[str], frames: int) -> dict[str, Any]:
    import uvicorn

    from gateway.api.app import create_app
    from gateway.config.settings import Secret, Settings
    from gateway.limits.keys import KeyStore

    mock = MockProcess.start(None)
    try:
        with tempfile.TemporaryDirectory(prefix="switchyard-mem-") as tmp:
            home = Path(tmp)
            policy = home / "policy.yaml"
            policy.write_text(POLICY_TEMPLATE.format(mock_port=mock.port))
            key, _ = KeyStore(home / "keys.db").create("bench")
            settings = Settings(
                home=home,
                policy_path=policy,
                admin_key=Secret("sy-admin-mem-profile-0123456789"),
                ledger_url=f"sqlite:///{home / 'ledger.db'}",
                redis_url=None,
                log_level="warning",
            )
            tracemalloc.start(frames)
            port = free_port()
            app = create_app(settings)
            server = uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
            )
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            while not server.started:
                time.sleep(0.05)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            _load(url, key, "hit", 200)  # one-time start-up work (first requests, imports)
            time.sleep(1.0)
            gc.collect()
            idle = memory_mb(_self()) or {}
            before = tracemalloc.take_snapshot()
            loads = {mode: _load(url, key, mode, requests) for mode in mix}
            time.sleep(2.0)
            gc.collect()
            after_load = memory_mb(_self()) or {}
            after = tracemalloc.take_snapshot()
            traced, traced_peak = tracemalloc.get_traced_memory()
            trimmed = malloc_trim()
            after_trim = memory_mb(_self()) or {}
            cache = app.state.sy.services.cache
            cache_info = {"entries": len(cache), "accounted_mb": round(cache.size_bytes / 2**20, 1)}
            growth = _top(after.compare_to(before, "traceback"), 15, frames)
            by_file = _top(after.compare_to(before, "filename"), 15, 1)
            server.should_exit = True
            thread.join(15)
    finally:
        mock.stop()
    return {
        "kind": "switchyard-mem-profile",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests_per_mode": requests,
        "load": loads,
        "rss_mb": {
            "idle": idle.get("rss_mb"),
            "after_load": after_load.get("rss_mb"),
            "after_malloc_trim": after_trim.get("rss_mb"),
            "peak": after_trim.get("peak_mb"),
            "malloc_trim_released": trimmed,
        },
        "traced_mb": {"now": round(traced / 2**20, 1), "peak": round(traced_peak / 2**20, 1)},
        "exact_cache": cache_info,
        "growth_by_site": growth,
        "growth_by_file": by_file,
    }


def _self() -> int:
    import os

    return os.getpid()


def _top(stats: list[tracemalloc.StatisticDiff], n: int, frames: int) -> list[dict[str, Any]]:
    out = []
    for st in sorted(stats, key=lambda s: s.size_diff, reverse=True)[:n]:
        where = [f"{f.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{f.lineno}"
                 for f in st.traceback[-frames:]]  # fmt: skip
        out.append({"kib": round(st.size_diff / 1024, 1), "blocks": st.count_diff, "where": where})
    return out


def render(report: dict[str, Any]) -> str:
    r, c, t = report["rss_mb"], report["exact_cache"], report["traced_mb"]
    lines = [
        f"# Gateway memory under load (tracemalloc) — {report['timestamp']}",
        "",
        f"- Load: {report['requests_per_mode']} requests per mode, closed loop 32: {report['load']}",
        f"- RSS: idle {r['idle']} MB, after load {r['after_load']} MB, after malloc_trim "
        f"{r['after_malloc_trim']} MB, peak {r['peak']} MB (tracemalloc's own overhead included)",
        f"- Traced Python allocations now {t['now']} MB, peak {t['peak']} MB",
        f"- Exact cache: {c['entries']} entries, {c['accounted_mb']} MB accounted",
        "",
        "## Growth by file (after load - idle)",
        "",
        "| KiB | blocks | file |",
        "|---|---|---|",
    ]
    lines += [f"| {g['kib']:,.1f} | {g['blocks']} | {g['where'][-1]} |" for g in report["growth_by_file"]]
    lines += [
        "",
        "## Growth by allocation site (innermost frame last)",
        "",
        "| KiB | blocks | where |",
        "|---|---|---|",
    ]
    lines += [
        f"| {g['kib']:,.1f} | {g['blocks']} | {' <- '.join(reversed(g['where']))} |"
        for g in report["growth_by_site"]
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.mem_profile", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=30_000, help="requests per mode")
    p.add_argument("--mix", default="miss,hit,stream", help="modes in order: miss, hit, stream")
    p.add_argument("--frames", type=int, default=4, help="traceback frames per allocation site")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    mix = [m for m in args.mix.split(",") if m]
    if any(m not in ("miss", "hit", "stream") for m in mix):
        p.error("--mix: miss, hit, stream")
    report = profile(args.requests, mix, max(1, args.frames))
    markdown = render(report)
    stamp = report["timestamp"].replace("-", "").replace(":", "")
    save_report(args.out / f"mem-{stamp}", report, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
