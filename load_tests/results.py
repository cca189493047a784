"""Regenerate load_tests/RESULTS.md: every reliability scenario against a real gateway process,
repeated, with the medians (and the worst run for anything that must be zero).

    python -m load_tests.results [--runs 3] [--soak-minutes 1] [--quick] [--no-durability]
    python -m load_tests.results --runs 1 --merge --only slow_bodies deadline_cut  # rows only

Scenarios (load_tests/scenarios/): upstream fault mix under load, Redis hung/killed/restarted
under load, policy reload storm with corrupted files, graceful SIGTERM drain (within and past
the deadline), overload bursts past ``server.max_in_flight``, a hostile-input battery, the
hostile clients and lying upstreams of issue 14 (scenarios/hardening.py), and a soak. The
crash-recovery tests of the ledger (SIGKILL under load, PostgreSQL down) are run through pytest
when present and reported as passed/failed. The newest full soak report under
load_tests/reports/ (``python -m load_tests.soak --minutes 10``) is included when there is one.
Raw figures go to load_tests/reports/results-<UTC>.json."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from load_tests.bench_procs import ROOT, machine_info
from load_tests.results_rows import ROWS, soak_row
from load_tests.scenarios.deps import run_redis_outage, run_reload_storm
from load_tests.scenarios.drain import run_drain
from load_tests.scenarios.faults import run_fault_mix
from load_tests.scenarios.hardening import (
    run_budget_drift,
    run_client_leaves,
    run_deadline_cut,
    run_lying_usage,
    run_prompt_sizes,
    run_slow_bodies,
)
from load_tests.scenarios.hostile import run_hostile
from load_tests.scenarios.overload import run_overload
from load_tests.soak import plot, run_soak

HERE = Path(__file__).resolve().parent
REPORTS = HERE / "reports"
DURABILITY_TESTS = ("tests/test_durability_sigkill.py", "tests/test_durability_postgres.py")

Scenario = Callable[[Path, bool], dict[str, Any]]


def _faults(work: Path, quick: bool) -> dict[str, Any]:
    return run_fault_mix(work, rps=20 if quick else 30, seconds=5 if quick else 15)


def _redis(work: Path, quick: bool) -> dict[str, Any]:
    return run_redis_outage(work, rps=20 if quick else 30, seconds=8 if quick else 12)


def _storm(work: Path, quick: bool) -> dict[str, Any]:
    return run_reload_storm(work, rps=20 if quick else 30, seconds=4 if quick else 8)


def _drain(work: Path, quick: bool) -> dict[str, Any]:
    within = run_drain(work / "within", streams=4, tokens=20, itl_ms=100, graceful_s=10)
    past = run_drain(work / "past", streams=2, tokens=100, itl_ms=100, graceful_s=1)
    for r in (within, past):
        r.pop("texts", None)
    return {"within": within, "past": past}


def _overload(work: Path, quick: bool) -> dict[str, Any]:
    return run_overload(work, max_in_flight=16, clients=100 if quick else 200, bursts=2 if quick else 3)


def _hostile(work: Path, quick: bool) -> dict[str, Any]:
    return run_hostile(work)


SCENARIOS: dict[str, Scenario] = {
    "faults": _faults,
    "redis": _redis,
    "reload_storm": _storm,
    "drain": _drain,
    "overload": _overload,
    "hostile": _hostile,
    "client_leaves": lambda work, quick: run_client_leaves(work),
    "budget_drift": lambda work, quick: run_budget_drift(work, each=5 if quick else 10),
    "prompt_sizes": lambda work, quick: run_prompt_sizes(work),
    "slow_bodies": lambda work, quick: run_slow_bodies(work),
    "lying_usage": lambda work, quick: run_lying_usage(work),
    "deadline_cut": lambda work, quick: run_deadline_cut(work),
}


def _machine() -> dict[str, Any]:
    info = machine_info()
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    return info


# ----------------------------------------------------------------------------- rows of the table
def run_durability(enabled: bool) -> list[dict[str, Any]]:
    out = []
    for rel in DURABILITY_TESTS:
        path = ROOT / rel
        if not enabled or not path.exists():
            out.append({"file": rel, "result": "not run" if path.exists() else "not present"})
            continue
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", rel],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        tail = (proc.stdout.strip().splitlines() or [""])[-1]
        out.append(
            {"file": rel, "result": tail, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
        )
    return out


def newest_full_soak() -> dict[str, Any] | None:
    best: dict[str, Any] | None = None
    for path in sorted(REPORTS.glob("soak-*.json")):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if data.get("minutes", 0) >= 10 and (best is None or path.name > best["_file"]):
                best = {**data, "_file": path.name}
    return best


HARDENING_NOTES = (
    "- **Hostile clients and lying upstreams** (issue 14; load_tests/scenarios/hardening.py, the",
    "  upstream is load_tests/lying_upstream.py): a client that reads 64 KB of a 20 MB stream and",
    "  closes (the gateway must stop reading the upstream: time to its 499 row and the CPU it",
    "  spent meanwhile); answers that fail inside the gateway next to good ones (the tenant's",
    "  budget must equal the sum of its ledger rows); one-word prompts of growing size with /healthz",
    "  polled; 32 connections that never finish their body against max_in_flight=8 (normal",
    "  clients must be served; the stalled ones get 408); impossible usage counts from the",
    "  upstream (every row written, priced, marked estimated); a drip stream longer than the",
    "  route's deadline_s (cut with an error event).",
)


def merge_rows(old_text: str, new_rows: list[list[str]], note: str) -> str:
    """``old_text`` (a RESULTS.md) with the table rows of ``new_rows`` replaced by label (the
    first cell) or, when new, added before the soak rows; ``note`` goes under the title, and
    the notes on the hardening scenarios are added if missing. For ``--only ... --merge``."""
    lines = old_text.splitlines()
    rendered = {row[0]: "| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in new_rows}
    out: list[str] = []
    pending = dict(rendered)
    for line in lines:
        if line.startswith("| ") and not line.startswith("| scenario") and not line.startswith("| ---"):
            label = line[2:].split(" | ", 1)[0]
            if label in rendered:
                out.append(pending.pop(label, rendered[label]))
                continue
            if label.startswith("Soak") and pending:
                out += list(pending.values())
                pending.clear()
        out.append(line)
    if pending:
        raise ValueError("no table of scenarios in the old RESULTS.md to merge into")
    if HARDENING_NOTES[0] not in out:
        at = next(i for i, ln in enumerate(out) if ln.startswith("- **Soak**"))
        out[at:at] = list(HARDENING_NOTES)
    out = [ln for ln in out if not ln.startswith("Rows regenerated by")]
    out[1:1] = ["", note]
    return "\n".join(out) + "\n"


def render(
    results: dict[str, list[dict[str, Any]]],
    soak: dict[str, Any],
    full_soak: dict[str, Any] | None,
    durability: list[dict[str, Any]],
    machine: dict[str, Any],
    runs: int,
    png: str | None,
) -> str:
    head = [
        "scenario",
        "load held",
        "faults survived",
        "bad inputs tried",
        "failed requests",
        "rows lost",
        "figures",
    ]
    rows = [ROWS[name](results[name]) for name in SCENARIOS if name in results]
    rows.append(soak_row(soak, "Soak (short form)"))
    if full_soak is not None:
        rows.append(soak_row(full_soak, f"Soak (full, {full_soak['_file']})"))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# Switchyard reliability results",
        "",
        f"Regenerated by `python -m load_tests.results --runs {runs}` on {stamp}. Every scenario drives",
        "a real `switchyard serve` process (one worker) against the mock upstream; figures are medians",
        f"of {runs} run(s), and the *failed requests* and *rows lost* columns show the worst run. A failed",
        "request is one that got neither a success, nor a clean OpenAI-shaped error, nor (streams) an",
        "error event without `[DONE]`; *rows lost* counts requests without their ledger row.",
        "",
        f"Machine: {machine['nproc']} cores, {machine['cpu_model']}, {machine.get('ram_gib', '?')} GiB RAM, "
        f"Python {machine['python']}, {machine['platform']}; load average at start "
        f"{machine.get('loadavg_at_start')}. The machine was shared with other work: latency figures are",
        "noisy; counts (failed requests, rows lost) are not.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    lines += ["", "## Crash recovery of the ledger (pytest)", ""]
    lines += ["| test file | result |", "| --- | --- |"]
    lines += [f"| `{d['file']}` | {d['result']} |" for d in durability]
    if png:
        lines += ["", "## Soak curve", "", f"![RSS and open file descriptors during the soak]({png})"]
    lines += [
        "",
        "## What each scenario does",
        "",
        "- **Upstream fault mix**: 30% of upstream calls fail at random with 500/502/503, 429 + Retry-After,",
        "  a TCP reset, a stall past the attempt timeout, a stall or a cut mid-stream, malformed JSON or",
        "  SSE, a wrong content type or an oversized body; route `auto` = [small, large], 1 retry.",
        "- **Redis**: the exact cache lives on the gateway's own `redis-server`, which is hung with",
        "  SIGSTOP, resumed, killed and restarted on the same port while the load runs.",
        "- **Reload storm**: the policy file is rewritten in place every 20 ms (torn halves, empty",
        "  files, invalid UTF-8, YAML errors, unknown fields, dangling references; one write in seven",
        "  good) with a SIGHUP after each write and the file watcher on; the storm ends on a broken file.",
        "- **SIGTERM**: streams in flight when SIGTERM arrives finish with `[DONE]` inside",
        "  `--graceful-timeout`; new connections are refused at once; streams longer than the deadline",
        "  are cut without `[DONE]`; every stream keeps its ledger row.",
        "- **Overload**: bursts of concurrent requests against a slow upstream; past",
        "  `server.max_in_flight` the gateway answers 503 + Retry-After at once, /healthz keeps",
        "  answering, every admitted request succeeds, and a later load within capacity is served in full.",
        "- **Hostile input**: malformed and deeply nested JSON, invalid UTF-8, odd numbers, wrong field",
        "  types, CRLF in model names, malformed raw HTTP, path traversal on /admin and /dashboard with",
        "  the admin and a tenant key, and a body that tries to choose the upstream and its key.",
        *HARDENING_NOTES,
        "- **Soak**: see `python -m load_tests.soak`; the full run is `--minutes 10`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.results", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--soak-minutes", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="smaller loads (a smoke run)")
    p.add_argument("--no-durability", action="store_true", help="skip the ledger crash tests (pytest)")
    p.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    p.add_argument(
        "--merge",
        action="store_true",
        help="with --only: replace only those rows in the existing RESULTS.md (no soak, no crash tests)",
    )
    p.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = p.parse_args(argv)
    machine = _machine()
    names = args.only or list(SCENARIOS)
    if args.merge:
        if not args.only or not args.out.exists():
            p.error("--merge needs --only and an existing RESULTS.md")
        return _merge_run(args, names, machine)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="switchyard-results-") as tmp:
        for run in range(args.runs):
            for name in names:
                t0 = time.monotonic()
                results[name].append(SCENARIOS[name](Path(tmp) / f"{name}-{run}", args.quick))
                print(f"run {run + 1}/{args.runs} {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
        soak = run_soak(args.soak_minutes, 40.0, 1.0, Path(tmp) / "soak")
    durability = run_durability(not args.no_durability)
    full = newest_full_soak()
    png_name = None
    png_source = full if full is not None else soak
    png_path = args.out.parent / "RESULTS-soak.png"
    if plot(png_source, png_path):
        png_name = png_path.name
    text = render(results, soak, full, durability, machine, args.runs, png_name)
    args.out.write_text(text)
    REPORTS.mkdir(parents=True, exist_ok=True)
    raw = REPORTS / time.strftime("results-%Y%m%dT%H%M%SZ.json", time.gmtime())
    soak_small = {k: v for k, v in soak.items() if k != "samples"}
    raw.write_text(
        json.dumps({"machine": machine, "results": results, "soak": soak_small, "durability": durability})
    )
    print(text)
    print(f"wrote {args.out} and {raw}", file=sys.stderr)
    rows = [ROWS[n](results[n]) for n in names] + [soak_row(soak, "soak")]
    bad = any(row[4] not in ("0", "-") or row[5] not in ("0", "-") for row in rows)
    return 1 if bad else 0


def _merge_run(args: argparse.Namespace, names: list[str], machine: dict[str, Any]) -> int:
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="switchyard-results-") as tmp:
        for run in range(args.runs):
            for name in names:
                t0 = time.monotonic()
                results[name].append(SCENARIOS[name](Path(tmp) / f"{name}-{run}", args.quick))
                print(f"run {run + 1}/{args.runs} {name}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    rows = [ROWS[n](results[n]) for n in names]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    note = (
        f"Rows regenerated by `python -m load_tests.results --runs {args.runs} --merge --only "
        f"{' '.join(names)}` on {stamp} (load average at start {machine.get('loadavg_at_start')}); "
        "the other rows are from the full run below."
    )
    args.out.write_text(merge_rows(args.out.read_text(), rows, note))
    REPORTS.mkdir(parents=True, exist_ok=True)
    raw = REPORTS / time.strftime("results-%Y%m%dT%H%M%SZ.json", time.gmtime())
    raw.write_text(json.dumps({"machine": machine, "results": results, "merged_into": str(args.out)}))
    print(args.out.read_text())
    print(f"wrote {args.out} and {raw}", file=sys.stderr)
    return 1 if any(row[4] not in ("0", "-") or row[5] not in ("0", "-") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
