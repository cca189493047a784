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
    """

    scenario: str
    label: str
    metric: str
    kind: str
    limit: float | None


SCENARIO_CHECKS = (
    Check("nonstream_open_300", "latency p50", "latency_p50_ms", "added", 1.0),
    Check("nonstream_open_300", "latency p99", "latency_p99_ms", "added", 3.0),
    Check("stream_open_100", "TTFT p50", "ttft_p50_ms", "added", 1.0),
    Check("stream_open_100", "TTFT p99", "ttft_p99_ms", "added", None),
    Check("closed_32_miss", "throughput", "rps", "rps", 3000.0),
    Check("closed_32_hit", "throughput", "rps", "rps", 6000.0),
)


def _errors(summary: dict[str, Any] | None) -> int | None:
    return None if summary is None else sum(summary["errors"].values())


def _row(check: Check, entry: dict[str, Any]) -> dict[str, Any]:
    direct, gateway = entry.get("direct"), entry.get("gateway")
    d = direct.get(check.metric) if direct else None
    g = gateway.get(check.metric) if gateway else None
    row: dict[str, Any] = {
        "scenario": check.scenario,
        "title": entry["title"],
        "metric": check.label,
        "unit": "req/s" if check.kind == "rps" else "ms",
        "direct": d,
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
    else:
        row["ratio"] = (g / d) if d and g is not None else None
        if check.limit is not None:
            row["target"] = f">= {check.limit:g} req/s"
            if g is not None:
                row["pass"] = g >= check.limit and row["errors"]["gateway"] == 0
    return row


def evaluate(scenarios: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Table rows and whether every target passed (False if any is missing)."""
    rows = [_row(c, scenarios[c.scenario]) for c in SCENARIO_CHECKS if c.scenario in scenarios]
    targeted = [r for r in rows if r["target"] is not None]
    return rows, bool(targeted) and all(r["pass"] is True for r in targeted)


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if unit == "req/s" else f"{value:.3f} ms"


def _delta(row: dict[str, Any]) -> str:
    if row["unit"] == "req/s":
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
        "- Upstream: load_tests.mock_upstream, zero latency; gateway `switchyard serve --workers 1`",
        "",
        "| scenario | metric | direct | gateway | added / ratio | target | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['title']} | {row['metric']} | {_num(row['direct'], row['unit'])} | "
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
        for side in ("direct", "gateway"):
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
