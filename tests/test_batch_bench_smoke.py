"""load_tests/batch_bench.py end to end at a tiny scale: the engine mock and a gateway process
start, the batch is paused during the alone phases (a policy reload sets the route's batch
concurrency to 0) and runs during the others, pairs alternate, the batch completes on the
self-hosted lane, and both reports are written with every phase measured."""

from __future__ import annotations

import json
from pathlib import Path

from load_tests import batch_bench


def test_batch_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bb"
    args = ["--items", "200", "--rate", "20", "--phase-s", "1", "--pairs", "2", "--max-pairs", "2",
            "--settle-s", "0.5", "--max-s", "60", "--out", str(out)]  # fmt: skip
    assert batch_bench.main(args) == 0
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["batch"]["status"] == "completed" and r["batch"]["completed"] == 200
    assert [p["order"] for p in r["pairs"]] == ["AB", "BA"]
    for p in r["pairs"]:
        assert p["alone"]["requests"] == 20 and p["alone"]["errors"] == 0
        assert p["batch"]["requests"] == 20 and p["batch"]["errors"] == 0
        assert p["alone"]["batch_items"] == 0  # paused: nothing of the batch runs in an alone phase
    assert r["batch"]["ran_in_batch_phases"] > 0
    assert r["cpu_ms_per_batch_item"]["gateway"] is not None and r["cpu_share_mean"]["gateway_batch"] > 0
    assert "Median p99 ratio" in out.with_suffix(".md").read_text()
