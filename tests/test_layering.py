"""The dependency rule of ARCHITECTURE.md, enforced over the source (AST), plus "no I/O at
import".

    core      imports nothing of ours
    config    imports core (and the top-level `gateway` package for __file__/__version__)
    providers, cache, routing, ledger, limits, telemetry
              import core/config and themselves, never each other
    pipeline.py, metering.py, runtime.py, api/*, cli/__init__.py, cli/admin.py, cli/router.py
              the only modules that wire several siblings together
    nothing   imports engine, torch, load_tests or tests (`switchyard engine` comes through
              the `switchyard.commands` entry point); only api/ (and cli/serve.py, which runs
              uvicorn) knows the HTTP server framework
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "gateway"
SIBLINGS = ("providers", "cache", "routing", "ledger", "limits", "telemetry")
WIRING = {
    "gateway.pipeline",
    "gateway.metering",
    "gateway.runtime",
    "gateway.cli",
    "gateway.cli.admin",
    "gateway.cli.router",
}  # plus gateway.api.*
FORBIDDEN_ROOTS = ("engine", "torch", "load_tests", "tests")
HTTP_SERVER_ROOTS = ("fastapi", "starlette", "uvicorn")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. gateway.cache.exact
    file: Path
    line: int
    target: str  # the imported module, absolute, e.g. gateway.core.types
    name: str | None = None  # for `from M import name` when name is not itself a module

    def __str__(self) -> str:
        what = f"{self.target} ({self.name})" if self.name else self.target
        return f"{self.file.relative_to(REPO)}:{self.line}: {self.module} imports {what}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """Every import in a file (also inside functions and `if TYPE_CHECKING:`), absolute.
    ``from gateway import cli_admin`` counts as importing the module ``gateway.cli_admin``."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    text = path.read_text(encoding="utf-8") if source is None else source
    tree = ast.parse(text, str(path))
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(mod, path, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                sub = f"{origin}.{alias.name}"
                if _is_module(sub):
                    found.append(Import(mod, path, node.lineno, sub))
                else:
                    found.append(Import(mod, path, node.lineno, origin, alias.name))
    return found


SOURCES = sorted(PKG.rglob("*.py"))
ALL_IMPORTS = [imp for path in SOURCES for imp in imports_of(path)]


def layer(dotted: str) -> str | None:
    """core/config/a sibling/api for gateway.X.Y; the module itself for a top-level module;
    "gateway" for the bare package; None for anything not ours."""
    parts = dotted.split(".")
    if parts[0] != "gateway":
        return None
    if len(parts) == 1:
        return "gateway"
    return parts[1]


def ours(imp: Import) -> bool:
    return layer(imp.target) is not None


def report(bad: list[Import], rule: str) -> str:
    return f"{rule}:\n" + "\n".join(f"  {imp}" for imp in bad)


# ----------------------------------------------------------------------------- the parser itself
def test_the_import_scanner_sees_what_it_should() -> None:
    # real files with known imports: a relative/aliased form would otherwise slip through
    cli = {imp.target for name in ("__init__.py", "serve.py") for imp in imports_of(PKG / "cli" / name)}
    assert {"gateway", "gateway.cli.admin", "gateway.config.loader", "uvicorn"} <= cli
    assert "gateway.core.errors" in {imp.target for imp in imports_of(PKG / "core" / "__init__.py")}
    assert len(SOURCES) > 20 and len(ALL_IMPORTS) > 100


def test_relative_imports_are_resolved() -> None:
    fake = PKG / "cache" / "_layering_probe.py"  # never written: the source is passed in
    src = "from . import keys\nfrom ..routing import router\nfrom .. import pipeline\ndef f():\n    import torch\n"
    got = [(i.line, i.target) for i in imports_of(fake, src)]
    assert got == [
        (1, "gateway.cache.keys"),
        (2, "gateway.routing.router"),
        (3, "gateway.pipeline"),
        (5, "torch"),
    ]


# ----------------------------------------------------------------------------- the rules
# Each rule: the imports (from the whole of gateway/) that break it.
Rule = Callable[[list[Import]], list[Import]]
LOWER = ("core", "config", *SIBLINGS)
IO_MODULES = ("socket", "sqlite3", "subprocess", "asyncio", "threading", "multiprocessing", "ssl", "http")


def core_imports_nothing_of_ours(imps: list[Import]) -> list[Import]:
    return [i for i in imps if layer(i.module) == "core" and ours(i) and layer(i.target) != "core"]


def core_is_plain_stdlib(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if layer(i.module) == "core"
        and not ours(i)
        and (i.target.split(".")[0] not in sys.stdlib_module_names or i.target.split(".")[0] in IO_MODULES)
    ]


def config_imports_only_core(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if layer(i.module) == "config" and ours(i) and layer(i.target) not in ("core", "config", "gateway")
    ]


def siblings_do_not_import_each_other(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if layer(i.module) in SIBLINGS
        and ours(i)
        and layer(i.target) not in ("core", "config", "gateway", layer(i.module))
    ]


def bare_gateway_gives_only_version(imps: list[Import]) -> list[Import]:
    return [i for i in imps if i.target == "gateway" and i.name not in (None, "__version__", "__file__")]


def only_wiring_modules_use_several_siblings(imps: list[Import]) -> list[Import]:
    bad: list[Import] = []
    for mod in sorted({i.module for i in imps}):
        if mod in WIRING or mod.startswith("gateway.api.") or mod == "gateway.api":
            continue
        own = layer(mod)
        uses = [i for i in imps if i.module == mod and layer(i.target) in SIBLINGS and layer(i.target) != own]
        limit = 0 if own in LOWER else 1  # a lower layer uses no other sibling; another module one
        if len({layer(i.target) for i in uses}) > limit:
            bad += uses
    return bad


def lower_layers_do_not_import_upper(imps: list[Import]) -> list[Import]:
    upper = ("pipeline", "runtime", "api", "cli", "cli_admin")
    return [i for i in imps if layer(i.module) in LOWER and layer(i.target) in upper]


def pipeline_does_not_know_http(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if i.module in ("gateway.pipeline", "gateway.runtime")
        and layer(i.target) in ("api", "cli", "cli_admin")
    ]


# No crossing: the CLI finds `switchyard engine ...` through the `switchyard.commands` entry
# point (see test_the_cli_finds_engine_through_its_entry_point).
def no_engine_torch_or_tests(imps: list[Import]) -> list[Import]:
    return [i for i in imps if i.target.split(".")[0] in FORBIDDEN_ROOTS]


def only_api_knows_the_http_server(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if i.target.split(".")[0] in HTTP_SERVER_ROOTS
        and layer(i.module) != "api"
        and i.module != "gateway.cli.serve"
    ]


RULES: dict[str, Rule] = {
    "gateway.core imports nothing from gateway outside itself": core_imports_nothing_of_ours,
    "gateway.core is plain dataclasses and errors (stdlib only, no I/O modules)": core_is_plain_stdlib,
    "gateway.config imports only gateway.core, itself and the bare `gateway` package": config_imports_only_core,
    "providers/cache/routing/ledger/limits/telemetry import only core, config and themselves": siblings_do_not_import_each_other,
    "only __version__/__file__ may be taken from the bare `gateway` package": bare_gateway_gives_only_version,
    "only pipeline.py, runtime.py, api/*, cli/ wire siblings together": only_wiring_modules_use_several_siblings,
    "core/config/siblings never import pipeline, runtime, api or the cli": lower_layers_do_not_import_upper,
    "pipeline/runtime do not depend on the HTTP layer or the cli": pipeline_does_not_know_http,
    "gateway/ never imports engine, torch, load_tests or tests": no_engine_torch_or_tests,
    "only gateway/api (and the cli that runs uvicorn) imports fastapi/starlette/uvicorn": only_api_knows_the_http_server,
}


@pytest.mark.parametrize("rule", list(RULES), ids=[f.__name__ for f in RULES.values()])
def test_dependency_rule(rule: str) -> None:
    bad = RULES[rule](ALL_IMPORTS)
    assert not bad, report(bad, rule)


def fake(rel: str, src: str) -> list[Import]:
    """The imports of a source that is never written, as if it lived at gateway/<rel>."""
    return imports_of(PKG / rel, src)


# (rule, a violating file, a file that keeps the rule)
SELF_CHECKS = [
    (
        core_imports_nothing_of_ours,
        fake("core/x.py", "from gateway.config import policy"),
        fake("core/x.py", "from gateway.core.types import Usage\nfrom . import errors"),
    ),
    (
        core_imports_nothing_of_ours,
        fake("core/x.py", "from .. import __version__"),
        fake("core/x.py", "import dataclasses"),
    ),
    (
        core_is_plain_stdlib,
        fake("core/x.py", "def f():\n    import pydantic"),
        fake("core/x.py", "from decimal import Decimal"),
    ),
    (core_is_plain_stdlib, fake("core/x.py", "import sqlite3"), fake("core/x.py", "import enum")),
    (
        config_imports_only_core,
        fake("config/x.py", "from gateway.cache.keys import canonical_key"),
        fake(
            "config/x.py", "import gateway\nfrom gateway import __version__\nfrom gateway.core import errors"
        ),
    ),
    (
        config_imports_only_core,
        fake("config/x.py", "from ..limits import keys"),
        fake("config/x.py", "from . import policy"),
    ),
    (
        siblings_do_not_import_each_other,
        fake("cache/x.py", "from ..routing import params"),
        fake("cache/x.py", "from gateway.config.policy import CachePolicy\nfrom gateway.cache import keys"),
    ),
    (
        siblings_do_not_import_each_other,
        fake("routing/x.py", "from gateway import ledger"),
        fake("routing/x.py", "from gateway.config.policy import RoutePolicy"),
    ),
    (
        siblings_do_not_import_each_other,
        fake("telemetry/x.py", "import gateway.providers.http"),
        fake("telemetry/x.py", "from gateway.core.errors import SwitchyardError"),
    ),
    (
        bare_gateway_gives_only_version,
        fake("ledger/x.py", "from gateway import something"),
        fake("ledger/x.py", "from gateway import __version__"),
    ),
    (
        only_wiring_modules_use_several_siblings,
        fake("helper.py", "from gateway.cache import keys\nfrom gateway.ledger import row"),
        fake("pipeline.py", "from gateway.cache import keys\nfrom gateway.ledger import row"),
    ),
    (
        only_wiring_modules_use_several_siblings,
        fake("limits/x.py", "from gateway.telemetry import metrics"),
        fake(
            "api/x.py",
            "from gateway.cache import keys\nfrom gateway.ledger import row\nfrom gateway.limits import keys",
        ),
    ),
    (
        lower_layers_do_not_import_upper,
        fake("ledger/x.py", "from gateway.pipeline import Reply"),
        fake("runtime.py", "from gateway.pipeline import Reply"),
    ),
    (
        lower_layers_do_not_import_upper,
        fake("config/x.py", "from gateway.api import app"),
        fake("cli.py", "from gateway.api import app"),
    ),
    (
        pipeline_does_not_know_http,
        fake("pipeline.py", "from gateway.api.wire import validate"),
        fake("pipeline.py", "from gateway.core.types import ChatRequest"),
    ),
    (
        no_engine_torch_or_tests,
        fake("routing/x.py", "def f():\n    import torch"),
        fake("routing/x.py", "import math"),
    ),
    (
        no_engine_torch_or_tests,
        fake("api/x.py", "from engine.profiles import load"),
        fake("api/x.py", "import fastapi"),
    ),
    (
        no_engine_torch_or_tests,
        fake("cli.py", "from load_tests.mock_upstream import MockUpstream"),
        fake("cli.py", "import json"),
    ),
    (
        no_engine_torch_or_tests,
        fake("cli/__init__.py", "def f():\n    from engine.cli import register"),
        fake("cli/__init__.py", "from importlib.metadata import entry_points"),
    ),
    (
        no_engine_torch_or_tests,
        fake("pipeline.py", "from engine.cli import register"),
        fake("pipeline.py", "import orjson"),
    ),
    (
        no_engine_torch_or_tests,
        fake("pipeline.py", "import tests.conftest"),
        fake("pipeline.py", "import orjson"),
    ),
    (
        only_api_knows_the_http_server,
        fake("pipeline.py", "from starlette.requests import Request"),
        fake("api/routes.py", "from starlette.requests import Request"),
    ),
    (
        only_api_knows_the_http_server,
        fake("providers/x.py", "import fastapi"),
        fake("cli/serve.py", "import uvicorn"),
    ),
]


@pytest.mark.parametrize(("rule", "violating", "keeping"), SELF_CHECKS)
def test_each_rule_can_fail(rule: Rule, violating: list[Import], keeping: list[Import]) -> None:
    flagged = rule(violating)
    assert flagged, f"{rule.__name__} missed {[str(i) for i in violating]}"
    assert all(i in violating for i in flagged)
    assert rule(keeping) == [], f"{rule.__name__} wrongly flagged {[str(i) for i in rule(keeping)]}"


def test_a_violation_report_names_file_and_line() -> None:
    bad = siblings_do_not_import_each_other(
        fake("cache/x.py", "import os\n\nfrom gateway.routing import params\n")
    )
    text = report(bad, "rule")
    assert text == "rule:\n  gateway/cache/x.py:3: gateway.cache.x imports gateway.routing.params"


def test_the_cli_finds_engine_through_its_entry_point() -> None:
    from importlib.metadata import entry_points

    from gateway.cli import COMMANDS_GROUP, build_parser

    found = {ep.name: ep.value for ep in entry_points(group=COMMANDS_GROUP)}
    assert found.get("engine") == "engine.cli:register", "pip install -e . registers the entry point"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "engine" in sub.choices


# ----------------------------------------------------------------------------- no I/O at import
IMPORT_ALL = """
import importlib, pkgutil, sys, threading
import gateway
names = sorted(m.name for m in pkgutil.walk_packages(gateway.__path__, "gateway."))
for name in names:
    importlib.import_module(name)
import gateway.api.app, gateway.cli
assert threading.active_count() == 1, [t.name for t in threading.enumerate()]
heavy = sorted(m for m in ("torch", "engine", "load_tests", "tests", "faiss") if m in sys.modules)
assert not heavy, heavy
print(len(names))
"""


def test_importing_every_module_does_no_io(tmp_path: Path) -> None:
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for d in (home, cwd, tmp):
        d.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWITCHYARD_", "PROMETHEUS_")) and k != "PYTHONPATH"
    }
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) > 20
    created = sorted(str(p.relative_to(tmp_path)) for d in (home, cwd, tmp) for p in d.rglob("*"))
    assert created == [], f"importing gateway created files: {created}"


def test_importing_the_cli_in_a_fresh_home_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", "import gateway.cli, gateway.api.app; print('ok')"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert list(home.iterdir()) == []
    assert not (home / ".switchyard").exists()
