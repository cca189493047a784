"""The benchmark runs end to end (mock upstream + gateway subprocesses) and reports every scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from load_tests.bench import SCENARIOS
from load_tests.bench_report import SCENARIO_CHECKS

ROOT = Path(__file__).resolve().parents[1]
METRICS = {
    "nonstream_open_300": ("latency_p50_ms", "latency_p99_ms"),
    "nonstream_open_1000": ("latency_p50_ms", "latency_p99_ms"),
    "stream_open_100": ("ttft_p50_ms", "ttft_p99_ms"),
    "closed_32_miss": ("rps",),
    "closed_32_stream": ("rps",),
    "closed_32_hit": ("rps",),
}


@pytest.mark.slow
def test_bench_quick_reports_every_scenario(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "load_tests.bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = list(tmp_path.glob("bench-*.json"))
    assert len(reports) == 1 and len(list(tmp_path.glob("bench-*.md"))) == 1
    report = json.loads(reports[0].read_text())
    assert report["gateway"]["error"] is None
    assert report["machine"]["nproc"] and report["machine"]["cpu_model"]
    assert set(report["scenarios"]) == {s.name for s in SCENARIOS} == set(METRICS)
    for name, metrics in METRICS.items():
        entry = report["scenarios"][name]
        for side in ("direct", "floor", "gateway"):
            summary = entry[side]
            assert summary is not None, (name, side)
            assert summary["count"] > 0 and not summary["errors"], (name, side, summary["errors"])
            for metric in metrics:
                assert isinstance(summary[metric], float | int) and summary[metric] > 0, (name, side, metric)
    assert report["scenarios"]["closed_32_hit"]["gateway"]["header_counts"].get("hit", 0) > 0
    rows = {(r["scenario"], r["metric"]): r for r in report["rows"]}
    # a row per scenario check, and five memory rows (bench_report.memory_rows)
    assert len(rows) == len(report["rows"]) == len(SCENARIO_CHECKS) + 5 and "| scenario |" in proc.stdout
    # the pass-through floor ran in the same run, and the gateway's RSS was sampled
    assert rows[("closed_32_miss", "throughput / floor")]["ratio"] > 0
    assert rows[("closed_32_miss", "server CPU / request")]["gateway"] > 0
    memory = report["memory"]
    assert 0 < memory["idle_mb"] <= memory["peak_mb"] and memory["after_load_mb"] > 0
    # the exact cache's share is read from the gateway's own gauge (the hits filled it)
    assert 0 < memory["exact_cache_mb"] < memory["after_load_mb"]
    assert memory["after_less_cache_mb"] == round(memory["after_load_mb"] - memory["exact_cache_mb"], 1)
