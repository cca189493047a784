"""The upstream-client comparison command runs and reports every client (bounded form)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from load_tests import client_compare


@pytest.mark.slow
def test_client_compare_reports_every_client(tmp_path: Path) -> None:
    affinity = os.sched_getaffinity(0)
    assert client_compare.main(["--seconds", "0.5", "--runs", "1", "--out", str(tmp_path)]) == 0
    assert os.sched_getaffinity(0) == affinity, "the command must give the CPUs back"
    (report_file,) = tmp_path.glob("clients-*.json")
    report = json.loads(report_file.read_text())
    assert set(report["req_per_s"]) == {"h1 (gateway unary)", "aiohttp", "httpx"}
    assert all(rate > 50 for rate in report["req_per_s"].values())
    assert all(cpu > 0 for cpu in report["cpu_us_per_request"].values())
    assert len(list(tmp_path.glob("clients-*.md"))) == 1
