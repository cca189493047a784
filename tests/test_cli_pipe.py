"""A CLI whose output is piped into ``head`` exits quietly (no BrokenPipeError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gateway.ledger.store import SQLiteLedger
from tests.test_ledger_store import make_row


def test_output_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.db")
    ledger.start()
    now = time.time()
    for i in range(3000):  # a report far larger than a pipe's buffer
        ledger.write(make_row(i, ts=now - 10, key_id=f"key-{i:05d}"))
    assert ledger.flush(20)
    ledger.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(SWITCHYARD_HOME=str(tmp_path), SWITCHYARD_LEDGER=f"sqlite:///{tmp_path / 'ledger.db'}")
    script = f"{sys.executable} -m gateway.cli spend --by key --since all | head -n 2"
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert proc.stdout.startswith("KEY"), proc.stdout[:200] + proc.stderr[-500:]
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-1000:]
