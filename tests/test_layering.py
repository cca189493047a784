"""The dependency rule of ARCHITECTURE.md, enforced over the source (AST), plus "no I/O at
import".

    core        imports nothing of ours (plain types, the error tree, redaction, ports)
    config      imports core (and the top-level `gateway` package for __file__/__version__)
    protocols, providers, cache, routing, ledger, limits, telemetry
                import core/config and themselves, never each other, but for one edge:
                providers import protocols (a vendor's wire format is written once in
                protocols/ and serves both the inbound adapter and the outbound provider);
                protocols never import providers
    flow        the request flow: sees I/O only through core.ports, never names a concrete store
    bootstrap   the composition root: the only module that calls the constructors of I/O parts
    api, cli    on top (HTTP only / argparse only); lab (offline training) only under cli
    nothing     imports engine, torch, load_tests or tests, and engine imports nothing of
                gateway (`switchyard engine` comes through the `switchyard.commands` entry
                point); only api/ (and cli/serve.py, which runs uvicorn) knows the HTTP server
    and also    no import circles (lazy imports count), os.environ only in config/,
                asyncio tasks started only by the task owner (flow/services.py)
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
SIBLINGS = ("protocols", "providers", "cache", "routing", "ledger", "limits", "telemetry")
# The one allowed edge between siblings (importer -> imported): providers speak their
# upstream's wire format through the vendor formats of protocols/.
SIBLING_EDGES = {"providers": ("protocols",)}
WIRING = ("flow", "bootstrap", "api", "cli", "lab")  # the layers that may use several siblings
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
ENGINE_SOURCES = sorted((REPO / "engine").rglob("*.py"))
ENGINE_IMPORTS = [imp for path in ENGINE_SOURCES for imp in imports_of(path)]


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
    src = "from . import keys\nfrom ..routing import router\nfrom .. import bootstrap\ndef f():\n    import torch\n"
    got = [(i.line, i.target) for i in imports_of(fake, src)]
    assert got == [
        (1, "gateway.cache.keys"),
        (2, "gateway.routing.router"),
        (3, "gateway.bootstrap"),
        (5, "torch"),
    ]


# ----------------------------------------------------------------------------- the rules
# Each rule: the imports (from the whole of gateway/) that break it.
Rule = Callable[[list[Import]], list[Import]]
LOWER = ("core", "config", *SIBLINGS)
UPPER = ("flow", "bootstrap", "api", "cli", "lab")
IO_MODULES = ("socket", "sqlite3", "subprocess", "asyncio", "threading", "multiprocessing", "ssl", "http")
# Modules that build or are the concrete I/O parts; the flow reaches them only through core.ports.
CONCRETE = (
    "gateway.ledger.store", "gateway.ledger.postgres", "gateway.ledger.sqlite", "gateway.ledger.open",
    "gateway.ledger.pg", "gateway.cache.exact", "gateway.cache.semantic_layer", "gateway.cache.semantic_redis",
    "gateway.cache.embedder", "gateway.cache.embed_backends", "gateway.limits.gate", "gateway.limits.redis_store",
    "gateway.limits.stores", "gateway.limits.keys_pg", "gateway.providers", "gateway.telemetry.tracing",
)  # fmt: skip


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


def allowed_edge(imp: Import) -> bool:
    """A sibling importing the one sibling it may (SIBLING_EDGES)."""
    return layer(imp.target) in SIBLING_EDGES.get(layer(imp.module) or "", ())


def siblings_do_not_import_each_other(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if layer(i.module) in SIBLINGS
        and ours(i)
        and layer(i.target) not in ("core", "config", "gateway", layer(i.module))
        and not allowed_edge(i)
    ]


def bare_gateway_gives_only_version(imps: list[Import]) -> list[Import]:
    return [i for i in imps if i.target == "gateway" and i.name not in (None, "__version__", "__file__")]


def only_wiring_layers_use_several_siblings(imps: list[Import]) -> list[Import]:
    bad: list[Import] = []
    for mod in sorted({i.module for i in imps}):
        own = layer(mod)
        if own in WIRING:
            continue
        uses = [
            i
            for i in imps
            if i.module == mod
            and layer(i.target) in SIBLINGS
            and layer(i.target) != own
            and not allowed_edge(i)
        ]
        limit = 0 if own in LOWER else 1  # a lower layer uses no other sibling; another module one
        if len({layer(i.target) for i in uses}) > limit:
            bad += uses
    return bad


def lower_layers_do_not_import_upper(imps: list[Import]) -> list[Import]:
    return [i for i in imps if layer(i.module) in LOWER and layer(i.target) in UPPER]


def flow_stays_under_the_composition_root(imps: list[Import]) -> list[Import]:
    return [
        i for i in imps if layer(i.module) == "flow" and layer(i.target) in ("bootstrap", "api", "cli", "lab")
    ]


def flow_names_no_concrete_store(imps: list[Import]) -> list[Import]:
    return [
        i
        for i in imps
        if layer(i.module) == "flow" and any(i.target == c or i.target.startswith(c + ".") for c in CONCRETE)
    ]


def only_api_and_cli_use_the_composition_root(imps: list[Import]) -> list[Import]:
    return [i for i in imps if layer(i.target) == "bootstrap" and layer(i.module) not in ("api", "cli")]


def only_the_cli_imports_lab(imps: list[Import]) -> list[Import]:
    return [i for i in imps if layer(i.target) == "lab" and layer(i.module) not in ("cli", "lab")]


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
    "gateway.core is plain dataclasses, errors and Protocols (stdlib only, no I/O modules)": core_is_plain_stdlib,
    "gateway.config imports only gateway.core, itself and the bare `gateway` package": config_imports_only_core,
    "protocols/providers/cache/routing/ledger/limits/telemetry import only core, config and themselves (providers also protocols)": siblings_do_not_import_each_other,
    "only __version__/__file__ may be taken from the bare `gateway` package": bare_gateway_gives_only_version,
    "only flow, bootstrap, api, cli and lab wire siblings together": only_wiring_layers_use_several_siblings,
    "core/config/siblings never import flow, bootstrap, api, cli or lab": lower_layers_do_not_import_upper,
    "flow never imports bootstrap, api, cli or lab": flow_stays_under_the_composition_root,
    "flow sees I/O only through core.ports (no concrete store, cache, provider or tracer module)": flow_names_no_concrete_store,
    "only api and cli import bootstrap": only_api_and_cli_use_the_composition_root,
    "only the cli imports lab (offline training stays out of the serving path)": only_the_cli_imports_lab,
    "gateway/ never imports engine, torch, load_tests or tests": no_engine_torch_or_tests,
    "only gateway/api (and cli/serve.py, which runs uvicorn) imports fastapi/starlette/uvicorn": only_api_knows_the_http_server,
}


@pytest.mark.parametrize("rule", list(RULES), ids=[f.__name__ for f in RULES.values()])
def test_dependency_rule(rule: str) -> None:
    bad = RULES[rule](ALL_IMPORTS)
    assert not bad, report(bad, rule)


def test_engine_imports_nothing_of_gateway() -> None:
    bad = [i for i in ENGINE_IMPORTS if i.target.split(".")[0] == "gateway"]
    assert len(ENGINE_SOURCES) > 3 and not bad, report(bad, "engine/ imports nothing of gateway")


# ----------------------------------------------------------------------------- import circles
def import_graph(imps: list[Import]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (lazy and TYPE_CHECKING imports included)."""
    graph: dict[str, set[str]] = {}
    for i in imps:
        if ours(i) and i.target != i.module:
            graph.setdefault(i.module, set()).add(i.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (iterative DFS, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path: list[str] = [root]
        stack = [iter(sorted(graph.get(root, ())))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_no_import_circles() -> None:
    cycle = find_cycle(import_graph(ALL_IMPORTS))
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_circle_finder_finds_circles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    lazy = fake("ledger/query.py", "def f():\n    from gateway.ledger import store\n")
    back = fake("ledger/store.py", "from gateway.ledger.query import f\n")
    cycle = ["gateway.ledger.query", "gateway.ledger.store", "gateway.ledger.query"]
    assert find_cycle(import_graph(lazy + back)) == cycle


# ----------------------------------------------------------------------------- calls, not imports
def calls_in(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, name) of every call in a file, by the called name (``f(...)``, ``x.f(...)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            if name is not None:
                found.append((node.lineno, name))
    return found


def environ_uses(path: Path, source: str | None = None) -> list[int]:
    """Lines that touch the process environment (``os.environ``, ``os.getenv``, ``os.putenv``)."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "unsetenv"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            lines += [node.lineno for a in node.names if a.name in ("environ", "getenv", "putenv")]
    return sorted(lines)


# I/O part constructors (and the factories that call them), by the sibling that defines them.
IO_CONSTRUCTORS = {
    "SQLiteLedger": "ledger", "PostgresLedger": "ledger", "NullLedger": "ledger", "open_ledger": "ledger",
    "MemoryCache": "cache", "RedisCache": "cache", "SemanticLayer": "cache", "RedisSemanticStore": "cache",
    "RedisStore": "limits", "KeyStore": "limits", "PostgresKeyStore": "limits", "open_key_store": "limits",
    "KeyCache": "limits", "Limits": "limits",
    "OpenAICompatProvider": "providers", "AnthropicProvider": "providers", "ReplicatedProvider": "providers",
    "build_tracer": "telemetry", "Metrics": "telemetry",
}  # fmt: skip


def io_constructions(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Calls that build an I/O part outside bootstrap.py and outside the part's own package."""
    own = layer(module_name(path))
    if module_name(path) == "gateway.bootstrap":
        return []
    return [(line, name) for line, name in calls_in(path, source) if IO_CONSTRUCTORS.get(name, own) != own]


def test_only_bootstrap_builds_the_io_parts() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}: {name}(...)" for p in SOURCES for line, name in io_constructions(p)
    ]
    assert not bad, "construct I/O parts in gateway/bootstrap.py only:\n  " + "\n  ".join(bad)


def test_the_environment_is_read_only_in_config() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}"
        for p in SOURCES
        if layer(module_name(p)) != "config"
        for line in environ_uses(p)
    ]
    assert not bad, "os.environ outside gateway/config/:\n  " + "\n  ".join(bad)


TASK_STARTERS = ("create_task", "ensure_future", "run_coroutine_threadsafe")


def test_background_tasks_are_started_only_by_the_task_owner() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}: {name}"
        for p in SOURCES
        if module_name(p) != "gateway.flow.services"
        for line, name in calls_in(p)
        if name in TASK_STARTERS
    ]
    assert not bad, "start background tasks through TaskOwner (gateway/flow/services.py):\n  " + "\n  ".join(
        bad
    )


def test_the_call_scanners_can_fail() -> None:
    probe = PKG / "flow" / "_probe.py"  # never written: the sources are passed in
    assert io_constructions(probe, "x = SQLiteLedger(path)\ny = m.RedisCache(u)") == [
        (1, "SQLiteLedger"),
        (2, "RedisCache"),
    ]
    assert io_constructions(PKG / "ledger" / "_probe.py", "x = SQLiteLedger(path)") == []
    assert io_constructions(PKG / "bootstrap.py", "x = SQLiteLedger(path)") == []
    assert environ_uses(probe, "import os\nv = os.environ.get('X')\nfrom os import getenv") == [2, 3]
    assert environ_uses(probe, "import os\nv = os.path.join('a')") == []
    tasks = [
        n for _, n in calls_in(probe, "loop.create_task(c)\nasyncio.ensure_future(c)") if n in TASK_STARTERS
    ]
    assert tasks == ["create_task", "ensure_future"]


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
        fake("core/x.py", "from decimal import Decimal\nfrom typing import Protocol"),
    ),
    (core_is_plain_stdlib, fake("core/x.py", "import asyncio"), fake("core/x.py", "import enum")),
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
        fake("protocols/x.py", "from gateway.providers import anthropic"),
        fake("protocols/x.py", "from gateway.core.types import Usage"),
    ),
    (
        siblings_do_not_import_each_other,
        fake("providers/x.py", "from gateway.cache.keys import canonical_key"),
        fake("providers/x.py", "from gateway.protocols.anthropic_outbound import to_anthropic_request"),
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
        only_wiring_layers_use_several_siblings,
        fake("helper.py", "from gateway.cache import keys\nfrom gateway.ledger import meter"),
        fake("flow/x.py", "from gateway.cache import keys\nfrom gateway.ledger import meter"),
    ),
    (
        only_wiring_layers_use_several_siblings,
        fake(
            "providers/x.py",
            "from gateway.protocols import anthropic_events\nfrom gateway.routing import params",
        ),
        fake("providers/x.py", "from gateway.protocols import anthropic_events\nfrom . import http"),
    ),
    (
        only_wiring_layers_use_several_siblings,
        fake("limits/x.py", "from gateway.telemetry import metrics"),
        fake(
            "api/x.py",
            "from gateway.cache import keys\nfrom gateway.ledger import meter\nfrom gateway.limits import keys",
        ),
    ),
    (
        lower_layers_do_not_import_upper,
        fake("ledger/x.py", "from gateway.flow.reply import Reply"),
        fake("bootstrap.py", "from gateway.flow.reply import Reply"),
    ),
    (
        lower_layers_do_not_import_upper,
        fake("config/x.py", "from gateway.api import app"),
        fake("cli/x.py", "from gateway.api import app"),
    ),
    (
        flow_stays_under_the_composition_root,
        fake("flow/x.py", "from gateway.api.state import AppState"),
        fake("flow/x.py", "from gateway.core.ports import Ledger"),
    ),
    (
        flow_stays_under_the_composition_root,
        fake("flow/x.py", "def f():\n    from gateway import bootstrap"),
        fake("api/x.py", "from gateway import bootstrap"),
    ),
    (
        flow_names_no_concrete_store,
        fake("flow/x.py", "from gateway.ledger.store import SQLiteLedger"),
        fake("flow/x.py", "from gateway.ledger.pricing import cost_of"),
    ),
    (
        flow_names_no_concrete_store,
        fake("flow/x.py", "from gateway.providers import openai_compat"),
        fake("flow/x.py", "from gateway.routing.plan import RoutePlan"),
    ),
    (
        only_api_and_cli_use_the_composition_root,
        fake("limits/x.py", "from gateway.bootstrap import start"),
        fake("cli/x.py", "from gateway.bootstrap import start"),
    ),
    (
        only_the_cli_imports_lab,
        fake("routing/x.py", "from gateway.lab import router_train"),
        fake("cli/router.py", "from gateway.lab import router_train"),
    ),
    (
        no_engine_torch_or_tests,
        fake("routing/x.py", "def f():\n    import torch"),
        fake("routing/x.py", "import math"),
    ),
    (
        no_engine_torch_or_tests,
        fake("cli/x.py", "def f():\n    from engine.cli import register"),
        fake("cli/x.py", "from importlib.metadata import entry_points"),
    ),
    (
        no_engine_torch_or_tests,
        fake("flow/x.py", "import tests.conftest"),
        fake("flow/x.py", "import orjson"),
    ),
    (
        only_api_knows_the_http_server,
        fake("flow/x.py", "from starlette.requests import Request"),
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
