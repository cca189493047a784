"""deploy/compose/cluster.yaml: three gateway replicas behind nginx, one PostgreSQL, one Redis,
checked without Docker (no daemon here): every reference resolves, every replica is wired to
the shared state exactly as the single-gateway compose file wires its gateway, each keeps its
own home (its ledger outbox), and the load balancer's upstreams are exactly the replicas, with
streaming passed through and no retry of a request a replica received."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.loader import load_policy
from tests.test_deploy_compose import COMPOSE_DIR, ENV_EXAMPLE, VAR, compose, env_example, interpolate

CLUSTER = COMPOSE_DIR / "cluster.yaml"
NGINX = COMPOSE_DIR / "nginx-cluster.conf"
GATEWAYS = ("gateway-1", "gateway-2", "gateway-3")


def cluster() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CLUSTER.read_text())
    return doc


def nginx_directives() -> list[tuple[tuple[str, ...], str, list[str]]]:
    """(enclosing blocks, directive, arguments) for every directive of the nginx config."""
    text = re.sub(r"#[^\n]*", "", NGINX.read_text())
    tokens = re.findall(r'"[^"]*"|[{};]|[^\s{};]+', text)
    out: list[tuple[tuple[str, ...], str, list[str]]] = []
    stack: list[str] = []
    words: list[str] = []
    for tok in tokens:
        if tok == "{":
            stack.append(" ".join(words))
            words = []
        elif tok == "}":
            assert not words, f"unterminated directive before }}: {words}"
            stack.pop()
        elif tok == ";":
            out.append((tuple(stack), words[0], words[1:]))
            words = []
        else:
            words.append(tok)
    assert not stack and not words, "unbalanced braces in the nginx config"
    return out


def directive(name: str, block: str) -> list[list[str]]:
    return [args for where, d, args in nginx_directives() if d == name and where and where[-1] == block]


def test_services_and_references() -> None:
    doc = cluster()
    services = doc["services"]
    assert set(services) == {*GATEWAYS, "lb", "redis", "postgres"}
    for name, svc in services.items():
        repo, _, tag = svc["image"].rpartition(":")
        assert repo and tag and tag != "latest", name
    declared, used = set(doc["volumes"]), set()
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}: no healthcheck"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).is_file(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
                used.add(source)
    assert used == declared


def test_variables_are_those_of_env_example() -> None:
    example = env_example()
    for m in VAR.finditer(CLUSTER.read_text()):
        if m.group(2) in (None, ":?", "?"):
            assert m.group(1) in example, f"${{{m.group(1)}}} is not in env.example"


def test_every_replica_shares_the_state_and_keeps_its_own_home(monkeypatch: pytest.MonkeyPatch) -> None:
    services = cluster()["services"]
    single = compose()["services"]["gateway"]
    example = env_example()
    homes = set()
    for name in GATEWAYS:
        gw = services[name]
        # wired as the single gateway is: one PostgreSQL (ledger, keys, stored Responses), one Redis
        assert gw["environment"] == single["environment"], name
        assert gw["command"] == single["command"] and gw["user"] == single["user"]
        assert gw["read_only"] is True and gw["cap_drop"] == ["ALL"]
        assert set(gw["depends_on"]) == {"redis", "postgres"}
        home = next(v for v in gw["volumes"] if v.endswith(":/var/lib/switchyard"))
        homes.add(home.split(":")[0])
    assert len(homes) == len(GATEWAYS)  # the outbox of a replica is its own
    env = {k: interpolate(str(v), example) for k, v in services["gateway-1"]["environment"].items()}
    assert env["SWITCHYARD_LEDGER"].startswith("postgresql://") and env["SWITCHYARD_REDIS_URL"].startswith(
        "redis://"
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    mount = next(v for v in services["gateway-1"]["volumes"] if v.endswith(":/etc/switchyard/policy.yaml:ro"))
    assert "auto" in load_policy(COMPOSE_DIR / mount.split(":")[0]).routes


def test_the_load_balancer_fronts_exactly_the_replicas() -> None:
    services = cluster()["services"]
    lb = services["lb"]
    assert set(lb["depends_on"]) == set(GATEWAYS)
    assert all(c == {"condition": "service_healthy"} for c in lb["depends_on"].values())
    assert lb["volumes"] == ["./nginx-cluster.conf:/etc/nginx/nginx.conf:ro"]
    published = lb["ports"][0].rsplit(":", 1)[1]
    (listen,) = directive("listen", "server")
    assert listen == [published]
    servers = directive("server", "upstream switchyard")
    port = services["gateway-1"]["command"][services["gateway-1"]["command"].index("--port") + 1]
    assert [s[0] for s in servers] == [f"{g}:{port}" for g in GATEWAYS]
    assert directive("proxy_pass", "location /") == [["http://switchyard"]]
    assert directive("proxy_buffering", "location /") == [["off"]]  # streams pass as they come
    assert directive("proxy_http_version", "location /") == [["1.1"]]
    (retry,) = directive("proxy_next_upstream", "location /")
    assert "non_idempotent" not in retry  # a POST a replica received is never sent twice
    (body,) = directive("client_max_body_size", "http")
    assert body == ["8m"]
    health = lb["healthcheck"]["test"]
    (ok,) = [where for where, d, args in nginx_directives() if d == "return" and args[0] == "200"]
    assert ok[-1] == "location = /lb-health" and "/lb-health" in health[-1]
    # everything nginx writes goes to the tmpfs of a read-only container
    for name in ("pid", "client_body_temp_path", "proxy_temp_path"):
        (args,) = [a for _, d, a in nginx_directives() if d == name]
        assert args[0].startswith("/tmp/"), name
    assert lb["read_only"] is True and lb["tmpfs"] == ["/tmp"] and lb["cap_drop"] == ["ALL"]


def test_docker_compose_config_where_docker_is_usable(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    usable = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if not usable:
        pytest.skip("no Docker CLI with the compose plugin here; the references are checked above instead")
    env_file = tmp_path / ".env"
    env_file.write_text(ENV_EXAMPLE.read_text())
    proc = subprocess.run(
        [str(docker), "compose", "--env-file", str(env_file), "-f", str(CLUSTER), "config", "-q"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
