from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def shared_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per test session for the embedder's ONNX export (made once, ~15 s)."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_model_dir: Path) -> None:
    monkeypatch.setenv("SWITCHYARD_HOME", str(tmp_path / "sy-home"))
    monkeypatch.setenv("SWITCHYARD_MODEL_DIR", str(shared_model_dir))
    for var in (
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENAI_BASE_URL",
        "SWITCHYARD_POLICY",
        "SWITCHYARD_ADMIN_KEY",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def mock() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as m:
        yield m


@pytest.fixture
def gateway(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        yield gw
    finally:
        gw.stop()


def service_unavailable(what: str, why: str) -> None:
    """Skip outside CI with the reason; under CI=true a missing service is a failure."""
    message = f"{what} is not reachable ({why}); tests that need it are skipped outside CI"
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is not reachable: {why}")
    pytest.skip(message)


def require_module(name: str) -> Any:
    """``name`` imported, for tests of an optional extra: skipped with the reason outside CI,
    a failure under CI=true (CI installs every extra, so a missing one is a broken install)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(
                f"{name} is required under CI=true (pip install -e '.[dev,ml,train,postgres]'): {exc}"
            )
        pytest.skip(f"{name} is not installed ({exc}); install the extras to run these tests")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every skip's reason, counted, without ``-rs``: tests that need ``../shared`` (evaluation
    data kept outside the repository) apart from those that need a service or a tool."""
    reports = [r for r in terminalreporter.stats.get("skipped", []) if isinstance(r, pytest.TestReport)]
    if not reports:
        return
    reasons = Counter(_skip_reason(r) for r in reports)
    shared = {k: n for k, n in reasons.items() if "shared" in k}
    other = {k: n for k, n in reasons.items() if k not in shared}
    write = terminalreporter.write_line
    terminalreporter.section("skipped, by reason (pytest -rs lists each test)", sep="-")
    for title, group in (
        ("need ../shared (evaluation data outside the repository)", shared),
        ("need a service, a tool or an extra", other),
    ):
        if group:
            write(f"{sum(group.values())} skipped that {title}:")
            for reason, n in sorted(group.items(), key=lambda kv: -kv[1]):
                write(f"  {n} x {reason}")
