"""The README's `engine breakeven --calibration` example runs on a fresh clone: the file it
names exists, has the format `engine bench` writes (its prices follow from its throughputs
and the profile's GPU price), says it is an example, and the policy loader can read it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from engine.calibration import calibration
from engine.profiles import PROFILE_DIR, load_profile
from gateway.config.catalog import read_calibration

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "engine" / "examples" / "qwen2.5-7b-bf16-ngram.calibration.example.json"


def test_readme_names_the_example_file() -> None:
    readme = (REPO / "README.md").read_text() + (
        REPO / "docs" / "deploy.md"
    ).read_text()  # the README links it
    named = set(re.findall(r"--calibration (engine/examples/\S+)", readme))
    assert named == {EXAMPLE.relative_to(REPO).as_posix()}
    assert EXAMPLE.is_file()


def test_the_example_is_in_the_bench_format_and_marked() -> None:
    doc = json.loads(EXAMPLE.read_text())
    assert "NOT a measurement" in doc["example"] and doc["measured_at"] is None
    profile = load_profile(str(PROFILE_DIR / f"{doc['profile']}.yaml"))
    cached_tps = None  # the cached-input price is recomputed from the cached price itself
    fresh = calibration(profile, doc["prompt_tokens_per_s"], doc["generation_tokens_per_s"], cached_tps)
    assert set(fresh) | {"example"} == set(doc)
    assert doc["gpu_usd_per_hour"] == fresh["gpu_usd_per_hour"]
    for kind in ("input", "output"):
        assert doc["price_usd_per_1m"][kind] == fresh["price_usd_per_1m"][kind]
    assert Decimal(doc["price_usd_per_1m"]["cached_input"]) <= Decimal(doc["price_usd_per_1m"]["input"])
    price = read_calibration(EXAMPLE)
    assert price.input == Decimal(doc["price_usd_per_1m"]["input"])


def test_the_readme_command_runs() -> None:
    cmd = [
        sys.executable, "-m", "gateway.cli", "engine", "breakeven", "qwen2.5-7b-bf16-ngram",
        "--calibration", str(EXAMPLE.relative_to(REPO)), "--api-input", "0.25", "--api-output", "2.00",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "break-even:" in proc.stdout and "tokens/day" in proc.stdout
