"""load_tests/batch_bench.py end to end at a tiny scale: the engine mock and a gateway process
start, the batch completes on the self-hosted lane, and both reports are written with every
phase measured."""

from __future__ import annotations

import json
from pathlib import Path

from load_tests import batch_bench


def test_batch_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bb"
    args = ["--items", "60", "--rate", "20", "--phase-s", "1", "--max-s", "30", "--out", str(out)]
    assert batch_bench.main(args) == 0
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["batch"]["status"] == "completed" and r["batch"]["completed"] == 60
    for phase in ("interactive_alone", "interactive_with_batch", "interactive_alone_after"):
        assert r[phase]["requests"] == 20 and r[phase]["errors"] == 0
    assert "p99 rise" in out.with_suffix(".md").read_text()
