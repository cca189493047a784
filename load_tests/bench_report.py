"""Benchmark targets, pass/fail evaluation and the Markdown rendering of a report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Check:
    """One table row: a metric of a scenario and, optionally, its target.

    ``kind`` "added": gateway minus direct must be <= ``limit`` (ms).
    ``kind`` "rps": gateway req/s must be >= ``limit``; the ratio gateway/direct is shown.
    ``kind`` "floor": gateway req/s / the pass-through floor's req/s must be >= ``limit``.
    ``kind`` "cpu": server CPU µs per request (floor and gateway; ratio gateway / floor).
    """

    scenario: str
    label: str
    metric: str
    kind: str
    limit: float | None


SCENARIO_CHECKS = (
    Check("nonstream_open_300", "latency p50", "latency_p50_ms", "added", 1.0),
    Check("nonstream_open_300", "latency p99", "latency_p99_ms", "added", 3.0),
    Check("nonstream_open_1000", "latency p50", "latency_p50_ms", "added", None),
    Check("nonstream_open_1000", "latency p99", "latency_p99_ms", "added", None),
    Check("stream_open_100", "TTFT p50", "ttft_p50_ms", "added", 1.0),
    Check("stream_open_100", "TTFT p99", "ttft_p99_ms", "added", None),
    Check("closed_32_miss", "throughput", "rps", "rps", 3000.0),
    Check("closed_32_hit", "throughput", "rps", "rps", 6000.0),
    Check("closed_32_miss", "throughput / floor", "rps", "floor", 0.70),
    Check("closed_32_hit", "throughput / floor", "rps", "floor", 0.70),
    Check("closed_32_stream", "throughput / floor", "rps", "floor", None),
    Check("nonstream_open_300", "server CPU / request", "cpu_us_per_request", "cpu", None),
    Check("nonstream_open_1000", "server CPU / request", "cpu_us_per_request", "cpu", None),
    Check("closed_32_miss", "server CPU / request", "cpu_us_per_request", "cpu", None),
    Check("closed_32_hit", "server CPU / request", "cpu_us_per_request", "cpu", None),
    Check("closed_32_stream", "server CPU / request", "cpu_us_per_request", "cpu", None),
)
UNITS = {"added": "ms", "rps": "req/s", "floor": "req/s", "cpu": "µs"}
IDLE_LIMIT_MB = 150.0
AFTER_LOAD_LIMIT = 1.2  # x idle


def _errors(summary: dict[str, Any] | None) -> int | None:
    return None if summary is None else sum(summary["errors"].values())


def _row(check: Check, entry: dict[str, Any]) -> dict[str, Any]:
    direct, gateway, floor = entry.get("direct"), entry.get("gateway"), entry.get("floor")
    d = direct.get(check.metric) if direct else None
    g = gateway.get(check.metric) if gateway else None
    f = floor.get(check.metric) if floor else None
    row: dict[str, Any] = {
        "scenario": check.scenario,
        "title": entry["title"],
        "metric": check.label,
        "unit": UNITS[check.kind],
        "direct": d,
        "floor": f,
        "gateway": g,
        "added": None,
        "ratio": None,
        "target": None,
        "pass": None,
        "errors": {"direct": _errors(direct), "gateway": _errors(gateway)},
    }
    if check.kind == "added":
        row["added"] = (g - d) if d is not None and g is not None else None
        if check.limit is not None:
            row["target"] = f"added <= {check.limit:g} ms"
            if row["added"] is not None:
                row["pass"] = row["added"] <= check.limit and row["errors"]["gateway"] == 0
    elif check.kind == "cpu":
        row["ratio"] = (g / f) if f and g is not None else None
    elif check.kind == "floor":
        row["ratio"] = (g / f) if f and g is not None else None
        if check.limit is not None:
            row["target"] = f"gateway/floor >= {check.limit:g}"
            if row["ratio"] is not None:
                row["pass"] = row["ratio"] >= check.limit and row["errors"]["gateway"] == 0
    else:
        row["ratio"] = (g / d) if d and g is not None else None
        if check.limit is not None:
            row["target"] = f">= {check.limit:g} req/s"
            if g is not None:
                row["pass"] = g >= check.limit and row["errors"]["gateway"] == 0
    return row


def memory_rows(memory: dict[str, Any] | None) -> list[dict[str, Any]]:
    """RSS rows (gateway figures in MB; the floor's RSS after load beside them)."""
    if not memory or memory.get("idle_mb") is None:
        return []
    idle, after, peak = memory["idle_mb"], memory.get("after_load_mb"), memory.get("peak_mb")
    ratio = memory.get("after_over_idle")
    less_cache, less_ratio = memory.get("after_less_cache_mb"), memory.get("after_less_cache_over_idle")
    ratios = {"RSS after load": ratio, "RSS after load less the exact cache": less_ratio}

    def row(metric: str, value: float | None, target: str | None, ok: bool | None) -> dict[str, Any]:
        return {
            "scenario": "memory", "title": "gateway RSS", "metric": metric, "unit": "MB",
            "direct": None, "floor": memory.get("floor_mb"), "gateway": value, "added": None,
            "ratio": ratios.get(metric), "target": target, "pass": ok,
            "errors": {"direct": None, "gateway": None},
        }  # fmt: skip

    return [
        row("RSS idle", idle, f"<= {IDLE_LIMIT_MB:g} MB", idle <= IDLE_LIMIT_MB),
        row(
            "RSS after load",
            after,
            f"<= {AFTER_LOAD_LIMIT:g} x idle",
            None if ratio is None else ratio <= AFTER_LOAD_LIMIT,
        ),
        row(
            "RSS after load less the exact cache",
            less_cache,
            f"<= {AFTER_LOAD_LIMIT:g} x idle",
            None if less_ratio is None else less_ratio <= AFTER_LOAD_LIMIT,
        ),
        row("RSS peak", peak, None, None),
        row("exact cache holds (cache.max_bytes bounds it)", memory.get("exact_cache_mb"), None, None),
    ]


def evaluate(
    scenarios: dict[str, Any], memory: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """Table rows and whether every target passed (False if any is missing)."""
    rows = [_row(c, scenarios[c.scenario]) for c in SCENARIO_CHECKS if c.scenario in scenarios]
    rows += memory_rows(memory)
    targeted = [r for r in rows if r["target"] is not None]
    return rows, bool(targeted) and all(r["pass"] is True for r in targeted)


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "MB":
        return f"{value:,.1f} MB"
    if unit == "µs":
        return f"{value:,.0f} µs"
    return f"{value:,.0f}" if unit == "req/s" else f"{value:.3f} ms"


def _delta(row: dict[str, Any]) -> str:
    if row["unit"] in ("req/s", "MB", "µs"):
        return "n/a" if row["ratio"] is None else f"x{row['ratio']:.2f}"
    return "n/a" if row["added"] is None else f"{row['added']:+.3f} ms"


def _verdict(value: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "-"}[value]


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    pin = m.get("pinning")
    pin_text = (
        f"gateway on CPU {pin['gateway']}, mock + loadgen on CPU {pin['mock_and_loadgen']}" if pin else "none"
    )
    lines = [
        f"# Switchyard gateway benchmark — {report['timestamp']}",
        "",
        f"- Machine: {m['nproc']} CPUs, {m['cpu_model']}; {m['platform']}; Python {m['python']}",
        f"- Load average at start: {m.get('loadavg_at_start')}",
        f"- CPU pinning: {pin_text}",
        f"- Mode: {'quick' if report['quick'] else 'full'}, {report['runs']} run(s), medians over runs; "
        f"durations {report['durations']}; elapsed {report['elapsed_s']} s",
        "- Upstream: load_tests.mock_upstream, zero latency; gateway `switchyard serve --workers 1`; "
        f"floor: `load_tests.bench_floor --client {report.get('floor_client') or 'aiohttp'}` (bare "
        "aiohttp server pass-through) on the gateway's core",
        "- added / ratio: gateway minus direct (ms), gateway / direct (req/s), gateway / floor "
        "(throughput / floor and CPU rows), after load / idle (RSS); server CPU / request: the "
        "process's user + system CPU (/proc) over the measured part / requests",
        "",
        "| scenario | metric | direct | floor | gateway | added / ratio | target | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['title']} | {row['metric']} | {_num(row['direct'], row['unit'])} | "
            f"{_num(row.get('floor'), row['unit'])} | "
            f"{_num(row['gateway'], row['unit'])} | {_delta(row)} | {row['target'] or '-'} | "
            f"{_verdict(row['pass'])} |"
        )
    lines += [
        "",
        f"Overall: {'PASS' if report['pass'] else 'FAIL'}",
        "",
        "## Requests, errors, cache header",
        "",
    ]
    for name, entry in report["scenarios"].items():
        for side in ("direct", "floor", "gateway"):
            s = entry.get(side)
            if s is not None:
                lines.append(
                    f"- {name} / {side}: {s['count']} requests, errors {s['errors'] or 'none'}, "
                    f"x-switchyard-cache {s['header_counts']}"
                )
    if report["gateway"].get("error"):
        lines += ["", f"**Gateway unavailable:** {report['gateway']['error']}"]
    return "\n".join(lines) + "\n"


def save_report(stem: Path, report: dict[str, Any], markdown: str) -> None:
    """Write ``stem``.json and ``stem``.md (creating the folder): every benchmark's report pair."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    stem.with_suffix(".md").write_text(markdown)
