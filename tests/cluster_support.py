"""A cluster for the tests: N real `switchyard serve` processes, each with its own
SWITCHYARD_HOME, sharing one PostgreSQL schema (ledger, keys, stored Responses) and one Redis
(limits, stickiness, exact cache), started together; a round-robin client over them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

from gateway.ledger.pg import pg_connect
from tests.gateway_harness import ADMIN_KEY, free_port

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Replica:
    home: Path
    env: dict[str, str]
    policy: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.home.parent / f"{self.home.name}.log"

    def launch(self) -> None:
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(self.port),
            "--policy",
            str(self.policy),
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*cmd, "--log-level", "warning"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"replica did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass
class Cluster:
    replicas: list[Replica]
    pg_url: str
    redis_prefix: str = ""  # the limits' keys (budgets, buckets, stickiness) live under it
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))
    _next: int = 0

    def replica_url(self, i: int) -> str:
        return self.replicas[i % len(self.replicas)].url

    def post(self, path: str, body: Any, key: str, i: int | None = None) -> httpx.Response:
        """POST to replica ``i``, or to the next one round-robin."""
        if i is None:
            i, self._next = self._next, self._next + 1
        return self.client.post(
            self.replica_url(i) + path, json=body, headers={"authorization": f"Bearer {key}"}
        )

    def admin(self, method: str, path: str, i: int, body: Any = None) -> httpx.Response:
        return self.client.request(method, self.replica_url(i) + path, json=body, headers=ADMIN)

    def new_key(self, tenant: str, i: int = 0, **limits: Any) -> tuple[str, str]:
        r = self.admin("POST", "/admin/keys", i, {"tenant": tenant, **limits})
        assert r.status_code == 201, r.text
        return str(r.json()["key"]), str(r.json()["key_id"])

    def ledger(self, where: str = "", params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with pg_connect(self.pg_url) as conn:
            return list(
                conn.execute(f"SELECT request_id, status, cost_usd FROM ledger {where}", params).fetchall()
            )


@contextmanager
def cluster(
    root: Path, policy_text: str, pg_url: str, n: int = 3, timeout: float = 45.0
) -> Iterator[Cluster]:
    policy = root / "policy.yaml"
    policy.write_text(policy_text)
    replicas = []
    for i in range(n):
        home = root / f"replica{i}"
        env = {
            **os.environ,
            "SWITCHYARD_HOME": str(home),
            "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
            "SWITCHYARD_POLICY_WATCH_S": "0",
            "SWITCHYARD_LEDGER": pg_url,
        }
        replicas.append(Replica(home, env, policy))
    made = Cluster(replicas, pg_url)
    try:
        for r in replicas:
            r.launch()
        deadline = time.monotonic() + timeout
        for r in replicas:
            r.wait_ready(deadline)
        yield made
    finally:
        made.client.close()
        for r in replicas:
            r.stop()
