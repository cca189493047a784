"""Hot reload of the policy: the admin endpoint, SIGHUP on a real `switchyard serve` process,
and start-up refusing a broken policy."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway, free_port, mock_policy, start_gateway

REPO = Path(__file__).resolve().parent.parent
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HI = [{"role": "user", "content": "hi"}]


def with_route(policy: str, name: str, target: str = "large") -> str:
    """``policy`` with one more route (inserted at the top of ``routes:``)."""
    assert policy.count("\nroutes:\n") == 1
    return policy.replace("\nroutes:\n", f"\nroutes:\n  {name}:\n    targets: [{target}]\n", 1)


def broken(policy: str) -> str:
    return (
        policy.replace("    targets: [small, large]\n", "    targets: [small, gpt-4x]\n", 1)
        + "bogus_key: 1\n"
    )


def metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m and m.group(1) == name and ",".join(sorted((m.group(2) or "").split(","))) == want:
            return float(m.group(3))
    return None


def model_ids(gw_url: str, key: str) -> list[str]:
    r = httpx.get(gw_url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200, r.text
    return [m["id"] for m in r.json()["data"]]


# ----------------------------------------------------------------------------- admin endpoint
def test_reload_needs_the_admin_key(gateway: RunningGateway, mock: MockUpstream) -> None:
    gateway.write_policy(with_route(mock_policy(mock.base_url), "fresh"))
    r = gateway.post("/admin/policy/reload", b"")  # a tenant key, not the admin key
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "not_admin"
    r = httpx.post(gateway.url + "/admin/policy/reload", timeout=10)
    assert r.status_code == 401, r.text
    assert "fresh" not in model_ids(gateway.url, gateway.key())


def test_bad_reload_keeps_the_old_policy(gateway: RunningGateway, mock: MockUpstream) -> None:
    before = model_ids(gateway.url, gateway.key())
    assert "auto" in before
    gateway.write_policy(broken(with_route(mock_policy(mock.base_url), "fresh")))

    r = httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_policy"
    assert err["problems"] == [  # every problem in one pass: the unknown field and the bad target
        {"path": "bogus_key", "message": "unknown field"},
        {"path": "routes.auto.targets[1].model", "message": "unknown model 'gpt-4x'"},
    ]

    # the running policy still serves, and the rejected route is not there
    assert model_ids(gateway.url, gateway.key()) == before
    chat = gateway.post("/v1/chat/completions", {"model": "auto", "messages": HI})
    assert chat.status_code == 200, chat.text
    assert chat.headers["x-switchyard-model"] == "small"
    assert gateway.post("/v1/chat/completions", {"model": "fresh", "messages": HI}).status_code == 404

    metrics = gateway.get("/metrics").text
    assert metric(metrics, "switchyard_policy_reloads_total", result="error") == 1.0
    assert metric(metrics, "switchyard_policy_reloads_total", result="ok") is None

    # a second failure (now a cross-reference problem) counts again
    gateway.write_policy(broken(mock_policy(mock.base_url)).replace("bogus_key: 1\n", ""))
    r = httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 422
    assert r.json()["error"]["problems"] == [
        {"path": "routes.auto.targets[1].model", "message": "unknown model 'gpt-4x'"}
    ]
    assert metric(gateway.get("/metrics").text, "switchyard_policy_reloads_total", result="error") == 2.0


def test_bad_reload_error_never_shows_provider_secrets(
    gateway: RunningGateway, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "sk-reload-canary-9a8b7c6d5e4f3a2b1c"
    monkeypatch.setenv("SY_RELOAD_CANARY", canary)
    text = mock_policy(mock.base_url).replace(
        "    type: openai\n", "    type: openai\n    headers: {x-token: '${SY_RELOAD_CANARY}'}\n", 1
    )
    text = text.replace("  small: {provider: mock,", "  small: {provider: '${SY_RELOAD_CANARY}',", 1)
    gateway.write_policy(text)
    r = httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 422
    assert canary not in r.text
    assert {"path": "models.small.provider", "message": "unknown provider '${SY_RELOAD_CANARY}'"} in r.json()[
        "error"
    ]["problems"]


def test_good_reload_makes_a_new_route_live(gateway: RunningGateway, mock: MockUpstream) -> None:
    assert gateway.post("/v1/chat/completions", {"model": "fresh", "messages": HI}).status_code == 404
    gateway.write_policy(with_route(mock_policy(mock.base_url), "fresh"))

    r = httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "reloaded"}

    assert "fresh" in model_ids(gateway.url, gateway.key())
    chat = gateway.post("/v1/chat/completions", {"model": "fresh", "messages": HI})
    assert chat.status_code == 200, chat.text
    assert chat.headers["x-switchyard-route"] == "fresh"
    assert chat.headers["x-switchyard-model"] == "large"
    assert mock.requests()[-1]["body"]["model"] == "mock-large"
    assert metric(gateway.get("/metrics").text, "switchyard_policy_reloads_total", result="ok") == 1.0

    # removing it again takes effect too
    gateway.write_policy(mock_policy(mock.base_url))
    assert httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10).status_code == 200
    assert "fresh" not in model_ids(gateway.url, gateway.key())
    assert gateway.post("/v1/chat/completions", {"model": "fresh", "messages": HI}).status_code == 404


def test_bad_then_good_reload(gateway: RunningGateway, mock: MockUpstream) -> None:
    gateway.write_policy("routes: [")
    r = httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 422
    (problem,) = r.json()["error"]["problems"]
    assert problem["path"] == "" and problem["message"].startswith("invalid YAML: line ")
    gateway.write_policy(with_route(mock_policy(mock.base_url), "fresh"))
    assert httpx.post(gateway.url + "/admin/policy/reload", headers=ADMIN, timeout=10).status_code == 200
    assert gateway.post("/v1/chat/completions", {"model": "fresh", "messages": HI}).status_code == 200


# ----------------------------------------------------------------------------- real process
def _serve_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SWITCHYARD_POLICY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL")
    }
    env.update(SWITCHYARD_HOME=str(home), SWITCHYARD_ADMIN_KEY=ADMIN_KEY, PYTHONUNBUFFERED="1")
    return env


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def served(tmp_path: Path, mock: MockUpstream) -> Iterator[tuple[Served, Path, dict[str, str]]]:
    home = tmp_path / "serve-home"
    policy_file = tmp_path / "served-policy.yaml"
    policy_file.write_text(mock_policy(mock.base_url))
    env = _serve_env(home)
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                str(policy_file),
                "--log-level",
                "info",
            ],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    srv = Served(proc, port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"switchyard serve exited with {proc.returncode}:\n{srv.output()}")
            try:
                if httpx.get(srv.url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"switchyard serve not ready within 30 s:\n{srv.output()}")
            time.sleep(0.1)
        yield srv, policy_file, env
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _create_key(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "create", "--tenant", "t"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    keys = re.findall(r"sk-sy-[A-Za-z0-9_\-]+", proc.stdout)
    assert len(keys) == 1, proc.stdout
    return keys[0]


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_sighup_reloads_a_running_server(
    served: tuple[Served, Path, dict[str, str]], mock: MockUpstream
) -> None:
    srv, policy_file, env = served
    key = _create_key(env)
    headers = {"authorization": f"Bearer {key}"}
    original = model_ids(srv.url, key)
    assert "auto" in original and "fresh" not in original

    # a good file + SIGHUP: the new route shows up and serves
    policy_file.write_text(with_route(mock_policy(mock.base_url), "fresh"))
    srv.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: "fresh" in model_ids(srv.url, key), 10, "the route 'fresh' after SIGHUP")
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "fresh", "messages": HI}, headers=headers, timeout=10
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-switchyard-model"] == "large"
    assert srv.proc.poll() is None

    # a broken file + SIGHUP: the process stays up and keeps the last good policy
    policy_file.write_text(broken(mock_policy(mock.base_url)))
    srv.proc.send_signal(signal.SIGHUP)
    _wait_for(
        lambda: (
            (
                metric(
                    httpx.get(srv.url + "/metrics", timeout=5).text,
                    "switchyard_policy_reloads_total",
                    result="error",
                )
                or 0
            )
            >= 1
        ),
        10,
        "the rejected reload to be counted",
    )
    assert srv.proc.poll() is None
    assert set(model_ids(srv.url, key)) == set(original) | {"fresh"}
    for route in ("auto", "fresh"):
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": route, "messages": HI},
            headers=headers,
            timeout=10,
        )
        assert r.status_code == 200, (route, r.text)
    assert "bogus_key: unknown field" in srv.output()

    # SIGTERM: a prompt, orderly exit
    srv.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    try:
        rc = srv.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"switchyard serve did not exit within 15 s of SIGTERM:\n{srv.output()}")
    assert time.monotonic() - t0 < 15
    # uvicorn re-raises the captured SIGTERM after a graceful shutdown
    assert rc in (0, -signal.SIGTERM), (rc, srv.output())
    assert "Traceback" not in srv.output()


def test_serve_with_a_broken_policy_exits_with_its_errors(tmp_path: Path, mock: MockUpstream) -> None:
    policy_file = tmp_path / "bad.yaml"
    policy_file.write_text(
        broken(mock_policy(mock.base_url)).replace("bogus_key: 1\n", "") + "cache: {backend: redis}\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--policy",
            str(policy_file),
        ],
        env=_serve_env(tmp_path / "home"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 15, elapsed
    assert f"{policy_file}: 2 problem(s)" in proc.stderr
    assert "routes.auto.targets[1].model: unknown model 'gpt-4x'" in proc.stderr
    assert "cache.redis_url: required when cache.backend is 'redis'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_with_invalid_yaml_exits_with_a_line_number(tmp_path: Path) -> None:
    policy_file = tmp_path / "bad.yaml"
    policy_file.write_text("routes:\n  auto:\n    targets: [a\n  b: 1\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(free_port()),
            "--policy",
            str(policy_file),
        ],
        env=_serve_env(tmp_path / "home"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "invalid YAML: line 4" in proc.stderr, proc.stderr


def test_policy_file_watcher_reloads_without_a_signal(tmp_path: Path, mock: MockUpstream) -> None:
    """Every worker watches the policy file, so multi-worker servers and ConfigMap updates
    converge; a broken file is refused and the running policy keeps serving."""
    gw = start_gateway(tmp_path, mock_policy(mock.base_url), policy_watch_s=0.1)
    try:

        def routes() -> set[str]:
            r = gw.get("/v1/models", headers=gw.headers())
            return {m["id"] for m in r.json()["data"]}

        assert "watched" not in routes()
        gw.write_policy(
            mock_policy(mock.base_url).replace("routes:\n", "routes:\n  watched: {targets: [small]}\n", 1)
        )
        deadline = time.monotonic() + 5
        while "watched" not in routes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "watched" in routes()
        gw.write_policy("routes: [not, a, mapping")
        time.sleep(0.5)
        assert "watched" in routes(), "a broken file must keep the running policy"
        metrics = gw.get("/metrics").text
        assert 'switchyard_policy_reloads_total{result="error"} 1.0' in metrics
        assert 'switchyard_policy_reloads_total{result="ok"} 1.0' in metrics
    finally:
        gw.stop()
