"""Boundaries beside the layer rules of test_layering.py:

* gateway/lab/ (offline training, evaluation, plots) is imported only by gateway/cli/, and
  itself imports core, config, the serving siblings and lab/ only;
* engine/ imports nothing of gateway/ (and gateway/ nothing of engine/: test_layering);
* the environment is read and written only under gateway/config/.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GATEWAY = REPO / "gateway"
LAB_MAY_IMPORT = ("core", "config", "providers", "cache", "routing", "ledger", "limits", "telemetry", "lab")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a file, relative ones resolved; for
    ``from P import name`` both ``P`` and ``P.name`` (name may be a module)."""
    mod = module_of(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            out.append((node.lineno, origin))
            out += [(node.lineno, f"{origin}.{a.name}") for a in node.names]
    return out


def area(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] != "gateway":
        return None
    return parts[1] if len(parts) > 1 else "gateway"


def lab_importers(paths: list[Path], sources: dict[Path, str] | None = None) -> list[str]:
    bad = []
    for path in paths:
        mod = module_of(path)
        if area(mod) in ("cli", "lab"):
            continue
        for line, target in imported(path, (sources or {}).get(path)):
            if area(target) == "lab":
                bad.append(f"{path.relative_to(REPO)}:{line}: {mod} imports {target}")
    return bad


def test_only_the_cli_imports_lab() -> None:
    bad = lab_importers(sorted(GATEWAY.rglob("*.py")))
    assert not bad, "gateway/lab/ is for the CLI only:\n" + "\n".join(bad)


def test_the_lab_rule_can_fail() -> None:
    probe = GATEWAY / "routing" / "_probe.py"  # never written
    src = "def f():\n    from ..lab import router_fit\n"
    assert lab_importers([probe], {probe: src}) == [
        "gateway/routing/_probe.py:2: gateway.routing._probe imports gateway.lab",
        "gateway/routing/_probe.py:2: gateway.routing._probe imports gateway.lab.router_fit",
    ]
    cli = GATEWAY / "cli" / "_probe.py"
    assert lab_importers([cli], {cli: "from gateway.lab import router_fit\n"}) == []


def test_lab_imports_only_core_config_and_the_siblings() -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line}: {target}"
        for path in sorted((GATEWAY / "lab").rglob("*.py"))
        for line, target in imported(path)
        if area(target) not in (None, "gateway", *LAB_MAY_IMPORT)
    ]
    assert not bad, "gateway/lab/ sits below the CLI and beside the flow:\n" + "\n".join(bad)
    assert (GATEWAY / "lab" / "router_fit.py").is_file()


def test_engine_imports_nothing_of_gateway() -> None:
    bad = [
        f"{path.relative_to(REPO)}:{line}: {target}"
        for path in sorted((REPO / "engine").rglob("*.py"))
        for line, target in imported(path)
        if target.split(".")[0] == "gateway"
    ]
    assert not bad, "engine/ talks to the gateway over HTTP and an entry point only:\n" + "\n".join(bad)


def environ_uses(path: Path, source: str | None = None) -> list[str]:
    """``os.environ`` / ``os.getenv`` / ``os.putenv`` / ``os.unsetenv`` and ``from os import
    environ``-style imports in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    names = {"environ", "environb", "getenv", "putenv", "unsetenv"}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            hits.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            hits += [
                f"{path.relative_to(REPO)}:{node.lineno}: os.{a.name}" for a in node.names if a.name in names
            ]
    return hits


def test_only_config_touches_the_environment() -> None:
    bad = [
        hit
        for path in sorted(GATEWAY.rglob("*.py"))
        if area(module_of(path)) != "config"
        for hit in environ_uses(path)
    ]
    assert not bad, "read settings through gateway.config.settings:\n" + "\n".join(bad)


def test_the_environment_rule_can_fail() -> None:
    probe = GATEWAY / "cache" / "_probe.py"
    assert environ_uses(probe, "import os\nx = os.environ.get('A')\n") == [
        "gateway/cache/_probe.py:2: .environ"
    ]
    assert environ_uses(probe, "from os import getenv\n") == ["gateway/cache/_probe.py:1: os.getenv"]
    assert environ_uses(probe, "import os\nos.replace('a', 'b')\n") == []
