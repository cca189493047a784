"""Run a real gateway (uvicorn on a loopback port, in a background thread) for tests."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the HTTP client the openai SDK ships with
import uvicorn

from gateway.api.app import create_app
from gateway.config.settings import Secret, Settings
from gateway.limits.keys import KeyStore

ADMIN_KEY = "sy-admin-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RunningGateway:
    home: Path
    policy_path: Path
    port: int
    server: uvicorn.Server
    thread: threading.Thread
    settings: Settings
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def app_state(self) -> Any:
        return self.server.config.app.state.sy

    def key(self, tenant: str = "team-a") -> str:
        if tenant not in self.keys:
            self.keys[tenant], _ = KeyStore(self.settings.keys_db).create(tenant)
        return self.keys[tenant]

    def headers(self, tenant: str = "team-a") -> dict[str, str]:
        return {"authorization": f"Bearer {self.key(tenant)}"}

    def post(self, path: str, body: Any = None, *, tenant: str = "team-a", **kw: Any) -> httpx.Response:
        headers = {**self.headers(tenant), **kw.pop("headers", {})}
        with httpx.Client(timeout=30) as client:
            if body is not None and not isinstance(body, (bytes, str)):
                return client.post(self.url + path, json=body, headers=headers, **kw)
            return client.post(self.url + path, content=body, headers=headers, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            return client.get(self.url + path, **kw)

    def write_policy(self, text: str) -> None:
        tmp = self.policy_path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.policy_path)

    def ledger_rows(self) -> list[dict[str, Any]]:
        import sqlite3

        self.app_state.services.ledger.flush(5.0)
        conn = sqlite3.connect(self.home / "ledger.db")
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("SELECT * FROM ledger ORDER BY ts, rowid")]
        finally:
            conn.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_gateway(
    tmp: Path,
    policy_text: str,
    *,
    redis_url: str | None = None,
    policy_watch_s: float = 0.0,
    fastpath: bool = True,
    otlp_endpoint: str | None = None,
) -> RunningGateway:
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    policy_path = tmp / "policy.yaml"
    policy_path.write_text(policy_text)
    settings = Settings(
        home=home,
        policy_path=policy_path,
        admin_key=Secret(ADMIN_KEY),
        ledger_url=f"sqlite:///{home / 'ledger.db'}",
        redis_url=redis_url,
        log_level="warning",
        policy_watch_s=policy_watch_s,
        fastpath=fastpath,
        otlp_endpoint=otlp_endpoint,
    )
    port = free_port()
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("gateway failed to start (see log output)")
        if time.monotonic() > deadline:
            raise RuntimeError("gateway did not start within 20 s")
        time.sleep(0.02)
    return RunningGateway(home, policy_path, port, server, thread, settings)


def mock_policy(mock_url: str, extra: str = "") -> str:
    """A policy with an OpenAI-compatible and an Anthropic mock provider."""
    return f"""
providers:
  mock:
    type: openai
    base_url: {mock_url}/v1
    api_key: sk-upstream-canary-0123456789abcdef
  mock-anthropic:
    type: anthropic
    base_url: {mock_url}
    api_key: sk-ant-canary-0123456789abcdef
models:
  small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, cached_input: 0.075, output: 0.60}}}}
  large: {{provider: mock, upstream: mock-large, price: {{input: 2.50, cached_input: 1.25, output: 10.00}}}}
  claude: {{provider: mock-anthropic, upstream: claude-mock, price: {{input: 3, cached_input: 0.30, cache_write: 3.75, output: 15}}}}
  embed: {{provider: mock, upstream: mock-embed, kind: embeddings, price: {{input: 0.02, output: 0}}}}
  legacy: {{provider: mock, upstream: mock-legacy, kind: completions, price: {{input: 1.5, output: 2}}}}
routes:
  auto:
    targets: [small, large]
    baseline: large
    retries: 1
    attempt_timeout_s: 5
    stream_idle_timeout_s: 2
    deadline_s: 20
  anthropic-first:
    targets: [claude, small]
    retries: 0
  code:
    targets: [small]
    params:
      pinned: {{temperature: 0.1, top_p: 0.2}}
  creative:
    targets: [small]
    params:
      defaults: {{temperature: 0.9}}
      max: {{temperature: 1.2}}
  restricted:
    targets: [large]
tenants:
  team-b:
    models: [auto, small]
    rpm: 5
breaker:
  failure_threshold: 3
  open_seconds: 1
{extra}
"""
