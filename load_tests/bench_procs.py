"""Processes for the benchmark: the mock upstream and the gateway, CPU pinning, machine facts."""

from __future__ import annotations

import contextlib
import os
import platform
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
POLICY_TEMPLATE = """\
server:
  auth: keys
providers:
  mock:
    type: openai
    base_url: http://127.0.0.1:{mock_port}/v1
    api_key: mock-key
models:
  mock-small:
    provider: mock
    upstream: mock-small
    price: {{input: 0.15, cached_input: 0.075, output: 0.60}}
routes:
  bench:
    targets: [mock-small]
cache:
  backend: memory
"""


class BenchSetupError(RuntimeError):
    """A benchmark process could not be started or did not become ready."""


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": list(load) if load else None,
    }


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process and of its child processes (best effort)."""
    todo = [pid]
    seen: set[int] = set()
    while todo and len(seen) < 256:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        task_dir = Path(f"/proc/{current}/task")
        try:
            tids = [int(t) for t in os.listdir(task_dir)]
        except OSError:
            tids = [current]
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in (task_dir / str(tid) / "children").read_text().split())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_line(stream: IO[str], timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def env_with_root(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@dataclass
class ListeningProcess:
    """A helper server started as ``python -m <module> ... --port 0`` that prints
    ``listening on <url>`` once it serves."""

    proc: subprocess.Popen[str]
    url: str

    @classmethod
    def launch(
        cls, args: list[str], what: str, cpus: set[int] | None, timeout: float
    ) -> tuple[subprocess.Popen[str], str]:
        """Start it (pinned to ``cpus``, its threads too once it serves); (process, url)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--port", "0"],
            cwd=ROOT,
            env=env_with_root(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if cpus:
            pin_tree(proc.pid, cpus)
        assert proc.stdout is not None
        line = _read_line(proc.stdout, timeout).strip()
        if not line.startswith("listening on "):
            stop_process(proc)
            proc.stdout.close()
            raise BenchSetupError(f"{what} did not start (got {line!r})")
        if cpus:
            pin_tree(proc.pid, cpus)
        return proc, line.split()[-1]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class MockProcess(ListeningProcess):
    """``load_tests.mock_upstream``: the zero-latency mock upstream."""

    @classmethod
    def start(cls, cpus: set[int] | None, timeout: float = 20.0) -> MockProcess:
        args = ["load_tests.mock_upstream", "--host", "127.0.0.1"]
        return cls(*cls.launch(args, "mock upstream", cpus, timeout))


class FloorProcess(ListeningProcess):
    """``load_tests.bench_floor``: the bare aiohttp pass-through in front of the mock."""

    @classmethod
    def start(
        cls, upstream: str, cpus: set[int] | None, timeout: float = 20.0, client: str = "aiohttp"
    ) -> FloorProcess:
        args = ["load_tests.bench_floor", "--upstream", upstream, "--client", client]
        return cls(*cls.launch(args, "pass-through floor", cpus, timeout))


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (via /proc/PID/task/TID/children)."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 256:
        current = todo.pop()
        if current in out:
            continue
        out.append(current)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError, ValueError):
                    children = Path(f"/proc/{current}/task/{tid}/children").read_text()
                    todo.extend(int(c) for c in children.split())
    return out


def memory_mb(pid: int) -> dict[str, float] | None:
    """RSS and peak RSS (VmHWM) in MB of a process tree, from /proc; None when unreadable."""
    rss = hwm = 0
    seen = False
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                    seen = True
                elif line.startswith("VmHWM:"):
                    hwm += int(line.split()[1])
    if not seen:
        return None
    return {"rss_mb": round(rss / 1024, 1), "peak_mb": round(hwm / 1024, 1)}


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds a process tree has used so far (/proc/PID/stat)."""
    if pid is None:
        return None
    total = 0.0
    seen = False
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
            seen = True
    return total if seen else None


def switchyard_cmd() -> list[str]:
    script = Path(sys.executable).parent / "switchyard"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())"]


def create_key(env: dict[str, str], timeout: float = 60.0, root: Path = ROOT) -> str:
    try:
        out = subprocess.run(
            [*switchyard_cmd(), "keys", "create", "--tenant", "bench"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        raise BenchSetupError(f"switchyard keys create failed: {exc} {detail[-500:]}") from exc
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    if not lines:
        raise BenchSetupError("switchyard keys create printed nothing")
    return lines[-1]


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @classmethod
    def start(
        cls,
        home: Path,
        mock_port: int,
        admin_key: str,
        cpus: set[int] | None,
        timeout: float = 60.0,
        extra_env: dict[str, str] | None = None,
        policy_template: str = POLICY_TEMPLATE,
        root: Path | None = None,
    ) -> tuple[GatewayProcess, str]:
        """Write the policy (``policy_template`` with ``{mock_port}``), create a client key,
        start ``switchyard serve``; returns (gateway, key). ``root``: run the gateway code of
        that source tree (e.g. a git worktree of an older commit) instead of this one."""
        policy = home / "policy.yaml"
        policy.write_text(policy_template.format(mock_port=mock_port))
        env = env_with_root(
            {"SWITCHYARD_HOME": str(home), "SWITCHYARD_ADMIN_KEY": admin_key, **(extra_env or {})}
        )
        root = root or ROOT
        if root != ROOT:
            env["PYTHONPATH"] = os.pathsep.join((str(root), env["PYTHONPATH"]))
        key = create_key(env, root=root)
        port = free_port()
        log_path = home / "gateway.log"
        cmd = [*switchyard_cmd(), "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--policy", str(policy), "--workers", "1", "--log-level", "warning"]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        if cpus:
            pin_tree(proc.pid, cpus)
        gateway = cls(proc, f"http://127.0.0.1:{port}", log_path)
        gateway.wait_ready(timeout)
        if cpus:
            pin_tree(proc.pid, cpus)  # threads/workers started during boot
        return gateway, key

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchSetupError(f"gateway exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise BenchSetupError(f"gateway not ready after {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self) -> None:
        stop_process(self.proc)
