"""Where the agent-CLI tests find their pinned CLIs: ``.tools/`` (``.ci/run`` installs them
there from npm) or the PATH. Missing: skipped with the install command (a failure under CI=true)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import service_unavailable

REPO = Path(__file__).resolve().parent.parent


def cli_binary(name: str, package: str, version: str) -> str:
    """The path of CLI ``name`` from npm ``package@version``."""
    local = REPO / ".tools" / "node_modules" / ".bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        service_unavailable(
            f"the {name} CLI", f"install it with `npm install --prefix .tools {package}@{version}`"
        )
        raise AssertionError("unreachable")
    return found
