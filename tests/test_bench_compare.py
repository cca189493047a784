"""load_tests.bench_compare: medians of two sets of bench reports and their ratio."""

from __future__ import annotations

import json
from pathlib import Path

from load_tests.bench_compare import compare, main


def _report(folder: Path, name: str, miss: float, p50: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"scenario": "closed_32_miss", "metric": "throughput", "gateway": miss},
        {"scenario": "nonstream_open_300", "metric": "latency p50", "gateway": p50},
        {"scenario": "closed_32_hit", "metric": "throughput", "gateway": None},  # gateway unavailable
    ]
    (folder / f"bench-{name}.json").write_text(json.dumps({"rows": rows}))


def test_medians_and_ratios(tmp_path: Path) -> None:
    for i, (miss, p50) in enumerate([(1000, 2.0), (1200, 3.0), (900, 2.5)]):
        _report(tmp_path / "before", str(i), miss, p50)
    for i, (miss, p50) in enumerate([(1100, 2.0), (1300, 2.0)]):
        _report(tmp_path / "after", str(i), miss, p50)
    rows = {(r["scenario"], r["metric"]): r for r in compare(tmp_path / "before", tmp_path / "after")["rows"]}
    miss = rows[("closed_32_miss", "throughput")]
    assert (miss["before"], miss["after"], miss["runs"]) == (1000, 1200, [3, 2])
    assert abs(miss["ratio"] - 1.2) < 1e-9
    assert rows[("nonstream_open_300", "latency p50")]["ratio"] == 0.8
    assert ("closed_32_hit", "throughput") not in rows


def test_empty_folders_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 2
