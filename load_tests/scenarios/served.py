"""A real ``switchyard serve`` process for scenarios: policy file, state home, client keys,
ledger rows (read from its SQLite file), and /proc figures (RSS, open file descriptors)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from gateway.limits.keys import KeyStore
from load_tests.bench_procs import ROOT, env_with_root, free_port

ADMIN_KEY = "sy-admin-scenario-key-0123456789"
CANARY = "sk-upstream-canary-0123456789abcdef"


def scenario_policy(mock_url: str, extra: str = "", *, server: str = "") -> str:
    """Two targets on the mock (fallback order small -> large), a canary provider key."""
    return f"""
server:
  auth: keys
{server}
providers:
  mock: {{type: openai, base_url: "{mock_url}/v1", api_key: {CANARY}}}
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, cached_input: 0.075, output: 0.60}}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, cached_input: 1.25, output: 10.00}}}}
routes:
  auto:
    targets: [small, large]
    baseline: large
    retries: 1
    attempt_timeout_s: 1.0
    stream_idle_timeout_s: 1.0
    deadline_s: 5
    cache: {{mode: deterministic}}
breaker: {{failure_threshold: 1000, open_seconds: 1}}
{extra}
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


TCP_STATES = {"01": "established", "06": "time_wait", "08": "close_wait", "0A": "listen"}


def fd_census(pid: int) -> dict[str, int]:
    """Open descriptors by kind: ``other`` (files, pipes, eventfds...) and sockets by TCP state.
    Pooled keep-alive connections are ESTABLISHED sockets; a leaked socket shows up as
    CLOSE_WAIT (the peer hung up, the process never closed it) or as ``other`` growing."""
    inodes: set[str] = set()
    census = {"total": 0, "other": 0, "sockets": 0}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        census["total"] += 1
        if target.startswith("socket:["):
            census["sockets"] += 1
            inodes.add(target[8:-1])
        else:
            census["other"] += 1
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                state = TCP_STATES.get(cols[3], "tcp_other")
                census[state] = census.get(state, 0) + 1
    return census


@dataclass
class ServedGateway:
    """``switchyard serve`` on a free loopback port with its own SWITCHYARD_HOME."""

    home: Path
    policy_text: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def policy_path(self) -> Path:
        return self.home / "policy.yaml"

    @property
    def log_path(self) -> Path:
        return self.home / "gateway.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def full_env(self) -> dict[str, str]:
        env = env_with_root(
            {
                "SWITCHYARD_HOME": str(self.home),
                "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
                "SWITCHYARD_POLICY_WATCH_S": "0",
                "PYTHONUNBUFFERED": "1",
                **self.env,
            }
        )
        for var in ("SWITCHYARD_POLICY", "SWITCHYARD_REDIS_URL", "SWITCHYARD_LEDGER", "OPENAI_API_KEY"):
            if var not in self.env:
                env.pop(var, None)
        return env

    def start(self, timeout: float = 60.0) -> ServedGateway:
        """Start and wait for /healthz; a port taken between choosing and binding it (other
        processes on a busy machine) is retried with another port."""
        for attempt in range(3):
            try:
                return self._start(timeout)
            except RuntimeError as exc:
                if "address already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> ServedGateway:
        self.home.mkdir(parents=True, exist_ok=True)
        self.policy_path.write_text(self.policy_text)
        self.port = free_port()
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--policy", str(self.policy_path), "--log-level", "info", *self.args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.full_env(), stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(self.url + "/healthz", timeout=1.0) as resp,
            ):
                if resp.status == 200:
                    return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"gateway not ready within {timeout:.0f} s:\n{self.log()[-3000:]}")

    def key(self, tenant: str = "team-a") -> str:
        if tenant not in self.keys:
            with KeyStore(self.home / "keys.db") as store:
                self.keys[tenant], _ = store.create(tenant)
        return self.keys[tenant]

    def headers(self, tenant: str = "team-a") -> dict[str, str]:
        return {"authorization": f"Bearer {self.key(tenant)}"}

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def ledger_rows(self) -> list[dict[str, Any]]:
        """Rows the gateway has committed so far (all of them once it has exited)."""
        path = self.home / "ledger.db"
        if not path.exists():
            return []
        conn = sqlite3.connect(path, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("SELECT * FROM ledger ORDER BY ts, rowid")]
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()

    def wait_rows(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        rows = self.ledger_rows()
        while len(rows) < count and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = self.ledger_rows()
        return rows

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def open_fds(self) -> int:
        return open_fds(self.pid)

    def fd_census(self) -> dict[str, int]:
        return fd_census(self.pid)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        self.terminate()
        if self.proc is not None and self.wait(timeout) is None:
            self.kill()

    def __enter__(self) -> ServedGateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
