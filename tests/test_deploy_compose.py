"""deploy/compose and deploy/Dockerfile, checked without Docker (no daemon and no image registry
here): the compose file is parsed and every reference in it resolved (services, volumes, bind
mounts, variables, the Prometheus/Grafana files it mounts, the policy it gives the gateway); the
Dockerfile is linted; the offline start it bakes in is run here for real.

`docker compose config` runs too where a Docker CLI with the compose plugin is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.loader import load_policy

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
ENV_EXAMPLE = COMPOSE_DIR / "env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"

VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def interpolate(value: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op in (":-", "-"):
            return arg or ""
        raise AssertionError(f"${{{name}}} is required and not set in env.example")

    return VAR.sub(sub, value)


# ------------------------------------------------------------------------------ compose
def test_services_and_profiles() -> None:
    services = compose()["services"]
    assert set(services) == {"gateway", "redis", "postgres", "prometheus", "grafana", "engine"}
    assert services["engine"]["profiles"] == ["gpu"]  # off by default
    assert all("profiles" not in s for n, s in services.items() if n != "engine")
    devices = services["engine"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


def test_images_are_pinned() -> None:
    for name, svc in compose()["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {image}"


def test_references_resolve() -> None:
    doc = compose()
    services = doc["services"]
    declared_volumes = set(doc["volumes"])
    used_volumes = set()
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy: no healthcheck"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared_volumes, f"{name}: volume {source} not declared"
                used_volumes.add(source)
    assert used_volumes == declared_volumes
    build = services["gateway"]["build"]
    context = (COMPOSE_DIR / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]) == DOCKERFILE


def test_variables_are_documented_and_secrets_not_committed() -> None:
    text = COMPOSE.read_text()
    example = env_example()
    for m in VAR.finditer(text):
        name, op = m.group(1), m.group(2)
        if op in (None, ":?", "?"):
            assert name in example, f"${{{name}}} has no default and is not in env.example"
    assert (COMPOSE_DIR / ".gitignore").read_text().split() == [".env"]
    for key, value in example.items():
        if any(w in key for w in ("PASSWORD", "ADMIN_KEY")):
            assert value.startswith("change-me"), key
        if key.endswith(("API_KEY", "TOKEN")) and "ADMIN" not in key:
            assert value == "", f"{key} must be empty in env.example"


def test_gateway_service_wiring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose()["services"]
    gw = services["gateway"]
    example = env_example()
    env = {k: interpolate(str(v), example) for k, v in gw["environment"].items()}
    pg = services["postgres"]["environment"]
    assert env["SWITCHYARD_LEDGER"] == (
        f"postgresql://{pg['POSTGRES_USER']}:{example['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    )
    assert env["SWITCHYARD_REDIS_URL"] == "redis://redis:6379/0"
    assert gw["user"] == "10001:10001" and gw["read_only"] is True and gw["tmpfs"] == ["/tmp"]
    assert gw["cap_drop"] == ["ALL"]
    assert "gateway-home:/var/lib/switchyard" in gw["volumes"]
    # The policy it mounts loads, with the environment compose gives the gateway.
    mount = next(v for v in gw["volumes"] if v.endswith(":/etc/switchyard/policy.yaml:ro"))
    assert env["SWITCHYARD_POLICY"] == "/etc/switchyard/policy.yaml"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    policy = load_policy(COMPOSE_DIR / mount.split(":")[0])
    assert {"auto", "local"} <= set(policy.routes)
    engine = services["engine"]
    served = next(a.split("=", 1)[1] for a in engine["command"] if a.startswith("--served-model-name="))
    local = policy.models["local-llm"]
    assert served == (local.upstream or "local-llm")
    assert policy.providers[local.provider].base_url.rstrip("/") == env["ENGINE_BASE_URL"].rstrip("/")
    assert "--enable-prompt-tokens-details" in engine["command"]


def test_healthchecks_probe_the_real_endpoints() -> None:
    services = compose()["services"]
    assert "/readyz" in " ".join(services["gateway"]["healthcheck"]["test"])
    assert "/health" in " ".join(services["engine"]["healthcheck"]["test"])
    assert services["engine"]["healthcheck"]["start_period"] == "900s"  # weights download + load


def test_docker_compose_config_where_docker_is_usable(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    usable = docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if not usable:
        pytest.skip("no Docker CLI with the compose plugin here; the references are checked above instead")
    env_file = tmp_path / ".env"
    env_file.write_text(ENV_EXAMPLE.read_text())
    for profile in ([], ["--profile", "gpu"]):
        proc = subprocess.run(
            [
                str(docker),
                "compose",
                "--env-file",
                str(env_file),
                "-f",
                str(COMPOSE),
                *profile,
                "config",
                "-q",
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------ Dockerfile
def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    ins = instructions()
    args = {
        rest.split("=", 1)[0]: rest.split("=", 1)[1] for word, rest in ins if word == "ARG" and "=" in rest
    }
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2 and all(" AS " in f for f in froms)
    for f in froms:
        image = f.split(" AS ")[0].strip()
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image.endswith("-slim-bookworm") and ":latest" not in image, image
    final = [i for i, (word, _) in enumerate(ins) if word == "FROM"][-1]
    tail = ins[final:]
    users = [rest for word, rest in tail if word == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1]), users
    assert users[-1].split(":")[0] == compose()["services"]["gateway"]["user"].split(":")[0]
    assert ("COPY", "--from=build /opt/switchyard /opt/switchyard") in tail
    assert not any(word == "RUN" and "pip install" in rest for word, rest in tail), "runtime stage stays slim"
    assert ("ENTRYPOINT", '["switchyard"]') in tail
    assert any(word == "HEALTHCHECK" and "/healthz" in rest for word, rest in tail)
    assert ("EXPOSE", "8080") in tail
    env = " ".join(rest for word, rest in tail if word == "ENV")
    assert "HF_HUB_OFFLINE=1" in env and "SWITCHYARD_HOME=/var/lib/switchyard" in env
    assert not any(word == "ADD" for word, _ in ins)
    assert not re.search(r"(API_KEY|PASSWORD|TOKEN)\s*=", DOCKERFILE.read_text())


def test_dockerfile_installs_the_lean_serving_extras() -> None:
    """The image serves with `ml` (ONNX Runtime, no torch) and `postgres`: each extra it names
    exists in pyproject.toml, and none of them (nor any RUN) brings torch."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    runs = [rest for word, rest in instructions() if word == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert any("pip install '.[ml,postgres]'" in r for r in installs), installs
    for run in installs:
        for group in re.findall(r"\.\[([\w,-]+)\]", run):
            for extra in group.split(","):
                assert extra in extras, f"{run}: no extra '{extra}' in pyproject.toml"
                assert not any(d.startswith("torch") for d in extras[extra]), f"'{extra}' brings torch"
        assert "torch" not in run, run


def test_dockerfile_copies_exist_and_pass_the_dockerignore() -> None:
    ignore = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    allowed = {p.removeprefix("!").rstrip("/") for p in ignore if p.startswith("!")}
    assert ignore[0] == "*"
    for word, rest in instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert src.rstrip("/") in allowed, f"COPY {src}: excluded by Dockerfile.dockerignore"


def test_offline_start_check_runs_without_the_hub(tmp_path: Path) -> None:
    """deploy/docker/offline_check.py is what the image build runs: with the Hugging Face hub
    switched off, an empty HOME and cache, the bundled policy and the packaged embedding model
    load and encode. (The torch backend here; the image build uses the default, onnx.)"""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HF_HOME": str(tmp_path / "hf"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SWITCHYARD_EMBEDDER": "torch",
        "OMP_NUM_THREADS": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",  # any attempt to reach a hub fails fast
        "HTTP_PROXY": "http://127.0.0.1:9",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "deploy/docker/offline_check.py"), str(home)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "offline check ok" in proc.stdout and "(384 dims)" in proc.stdout
