"""The soak run in its bounded CI form (~40 s): steady streaming + cached load through a real
`switchyard serve`; RSS growth after warm-up under 10%, no file-descriptor growth, no error,
no ledger row lost, and the JSON/Markdown/PNG reports written. The full run is
`python -m load_tests.soak --minutes 10` (see load_tests/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

from load_tests.soak import RSS_LIMIT, run_soak, write_reports


def test_short_soak_holds_memory_and_descriptors(tmp_path: Path) -> None:
    result = run_soak(0.6, 30.0, 1.0, tmp_path / "work")
    load = result["load"]
    assert load["errors"] == {} and load["ok"] == load["requests"] >= 500
    assert load["cache"].get("hit", 0) > 0 and load["cache"].get("miss", 0) > 0
    assert result["rows_lost"] == 0 and result["ledger_statuses"] == {"ok": load["ok"]}
    assert result["rss_growth"] < RSS_LIMIT, result["rss_growth"]
    assert result["fd_growth"] <= 0, (result["fds_after_warmup_quiet"], result["fds_end_quiet"])
    assert len(result["samples"]) >= 20

    paths = write_reports(result, tmp_path / "reports")
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved["machine"]["nproc"] >= 1 and saved["rows_lost"] == 0
    assert "RSS growth after warm-up" in Path(paths["md"]).read_text()
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
