"""Helpers shared by the budget / rate-limit / admin tests: concurrent requests against a
running gateway, ledger sums, and a gateway run as a separate `switchyard serve` process."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx

from tests.conftest import service_unavailable
from tests.gateway_harness import ADMIN_KEY, free_port

HELLO = [{"role": "user", "content": "hello there"}]


async def _fire(urls: list[str], key: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        headers = {"authorization": f"Bearer {key}"}
        tasks = [
            client.post(urls[i % len(urls)] + "/v1/chat/completions", json=body, headers=headers)
            for i in range(n)
        ]
        return list(await asyncio.gather(*tasks))


def fire(urls: list[str], key: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    """``n`` concurrent chat requests, spread round-robin over the gateways at ``urls``."""
    return asyncio.run(_fire(urls, key, n, body))


def ledger_cost(db: Path, tenant: str) -> Decimal:
    """Sum of cost_usd of ``tenant``'s rows (exact)."""
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT cost_usd FROM ledger WHERE tenant = ?", (tenant,)).fetchall()
    finally:
        conn.close()
    return sum((Decimal(str(r[0])) for r in rows if r[0] is not None), Decimal(0))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def serve(home: Path, policy: Path, log: Path, env: dict[str, str] | None = None) -> GatewayProcess:
    """`switchyard serve` as its own process (a real second replica)."""
    port = free_port()
    full_env = {
        **os.environ,
        "SWITCHYARD_HOME": str(home),
        "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
        "SWITCHYARD_POLICY_WATCH_S": "0",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--policy", str(policy)]
    cmd += ["--log-level", "warning"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    gw = GatewayProcess(proc, port, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(gw.url + "/healthz", timeout=1).status_code == 200:
                return gw
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    gw.stop()
    raise RuntimeError(f"gateway did not start: {log.read_text()[-2000:]}")


REDIS_URL = "redis://127.0.0.1:6379/0"


@contextmanager
def redis_prefix(name: str) -> Iterator[str]:
    """A unique key prefix on the shared Redis, its keys deleted at the end (skips outside CI
    when Redis is unreachable; fails under CI=true)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        service_unavailable("Redis at 127.0.0.1:6379", str(exc))
    p = unique(name) + ":"
    try:
        yield p
    finally:
        keys = list(client.scan_iter(match=p + "*"))
        if keys:
            client.delete(*keys)
        client.close()
