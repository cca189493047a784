"""The image the Helm chart runs is built by the user (no registry publishes it): the
documented build context (the repository root with deploy/Dockerfile.dockerignore) must hold
everything deploy/Dockerfile copies, and what it holds must build the package the image
installs. Checked without Docker: the ignore file is applied to the working tree as Docker
applies it, the wheel is built from that copy with the project's own build backend, and the
README documents build, push and `image.repository` consistently with the chart."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
VALUES = ROOT / "deploy" / "helm" / "switchyard" / "values.yaml"


def _rules() -> list[tuple[bool, str]]:
    """(include, pattern) in file order; Docker: the last matching rule wins."""
    out = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            include = line.startswith("!")
            out.append((include, line.removeprefix("!").strip("/")))
    return out


def _matches(pattern: str, path: str) -> bool:
    """A pattern matches a path or any folder above it (``gateway/`` takes its files)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return any(fnmatch.fnmatchcase(p, tail) for p in parts) or any(
            fnmatch.fnmatchcase(p, pattern) for p in prefixes
        )
    return any(fnmatch.fnmatchcase(p, pattern) and p.count("/") == pattern.count("/") for p in prefixes)


def in_context(path: str, rules: list[tuple[bool, str]]) -> bool:
    kept = True
    for include, pattern in rules:
        if _matches(pattern, path):
            kept = include
    return kept


def _repo_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_ignore_rules_behave_as_docker_reads_them() -> None:
    rules = _rules()
    assert in_context("gateway/api/routes.py", rules)
    assert in_context("deploy/docker/offline_check.py", rules)
    assert not in_context("gateway/api/__pycache__/routes.cpython-311.pyc", rules)
    assert not in_context("tests/test_deploy_image.py", rules)
    assert not in_context(".venv/bin/python", rules)
    assert not in_context("deploy/helm/switchyard/values.yaml", rules)


def test_every_copy_source_is_in_the_build_context() -> None:
    rules = _rules()
    files = _repo_files()
    for word, rest in _instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = [a for a in rest.split() if not a.startswith("--")]
        for src in sources:
            src = src.rstrip("/")
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            under = [f for f in files if f == src or f.startswith(src + "/")]
            assert under and all(in_context(f, rules) for f in under if "__pycache__" not in f), (
                f"COPY {src}: excluded by Dockerfile.dockerignore"
            )


def test_the_build_context_builds_the_package(tmp_path: Path) -> None:
    """What Docker would send, copied file by file, builds the wheel `pip install '.[ml,postgres]'`
    installs in the image, with the static files, policies and engine profiles inside."""
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling (the project's build backend) is not installed: pip install hatchling")
    rules = _rules()
    ctx = tmp_path / "context"
    sent = [f for f in _repo_files() if in_context(f, rules)]
    for rel in sent:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, ctx / rel)
    assert not any(f.startswith(("tests/", ".venv/", "load_tests/")) for f in sent)
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ctx)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("switchyard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "gateway/api/static/dashboard.html",
        "gateway/api/static/login.html",
        "gateway/_policies/default.yaml",
        "gateway/config/prices.json",
        "engine/profiles/qwen2.5-7b-bf16-ngram.yaml",
        "engine/examples/qwen2.5-7b-bf16-ngram.calibration.example.json",
    ):
        assert needed in names, needed


def test_base_image_is_pinned_to_a_python_the_project_supports() -> None:
    args = dict(rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest)
    image = args["PYTHON_IMAGE"]
    m = re.fullmatch(r"python:(3\.\d+)-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", image)
    assert m is not None, f"base image {image!r}: pin python:3.X-slim-<debian release>"
    requires = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text())
    assert requires is not None
    assert tuple(map(int, m.group(1).split("."))) >= tuple(map(int, requires.group(1).split(".")))


def test_readme_documents_build_push_and_image_repository() -> None:
    readme = (ROOT / "README.md").read_text() + (
        ROOT / "docs" / "deploy.md"
    ).read_text()  # the README links it
    build = re.search(r"docker build -f (\S+) -t (\$REGISTRY|REGISTRY)/switchyard:(\S+) \.", readme)
    assert build is not None and build.group(1) == "deploy/Dockerfile"
    assert re.search(r"docker push (\$REGISTRY|REGISTRY)/switchyard:", readme)
    assert "--set image.repository=" in readme and "--set image.tag=" in readme
    values = yaml.safe_load(VALUES.read_text())
    assert values["image"]["repository"] == "switchyard/switchyard"  # what the README says to override
    assert "switchyard/switchyard" in readme and "not published" in readme
