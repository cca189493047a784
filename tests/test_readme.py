"""The README's examples run as written. A fenced block after ``<!-- runnable -->`` (bash or
python) runs, in README order, against a real ``switchyard serve`` on the shipped default
policy, on a fresh SWITCHYARD_HOME and HOME, its providers pointed at the mock upstream through
the environment the policy reads; ``127.0.0.1:8080`` in a block is the test's port. What a bash
block exports reaches the blocks after it. ``<!-- runnable: needs NAME -->``: skipped, saying
so, when the command NAME is not installed (the agent CLIs: ``.ci/run`` installs them under
``.tools/``); ``<!-- runnable: real-provider -->``: skipped, it needs a real provider key.
``switchyard`` in a block is this tree's CLI. The README stays at most 250 lines, and no page
of the docs names an internal issue."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import free_port

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
_BLOCK = re.compile(r"<!-- runnable(?::\s*([^>]*?))?\s*-->\s*\n```(bash|python)\n(.*?)\n```", re.S)


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    needs: str
    code: str


def blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(text[: m.start()].count("\n") + 1, m.group(2), (m.group(1) or "").strip(), m.group(3))
        for m in _BLOCK.finditer(text)
    ]


def test_readme_is_short_and_marks_its_examples() -> None:
    assert len(README.read_text().splitlines()) <= 250
    found = blocks()
    assert len(found) >= 6 and {b.lang for b in found} == {"bash", "python"}


def test_docs_name_no_internal_issue() -> None:
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        hits = re.findall(r"\b[Ii]ssue \d+|\(#\d+\)", page.read_text())
        assert not hits, (page.name, hits)


@dataclass
class Session:
    env: dict[str, str]
    port: int
    cwd: Path


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    tmp = tmp_path_factory.mktemp("readme")
    bin_dir, home, work = tmp / "bin", tmp / "home", tmp / "work"
    for d in (bin_dir, home, work):
        d.mkdir()
    shim = bin_dir / "switchyard"  # this tree's CLI, whatever `switchyard` the venv has
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m gateway.cli "$@"\n')
    shim.chmod(0o755)
    tools = REPO / ".tools" / "node_modules" / ".bin"
    path = os.pathsep.join(
        [str(bin_dir), str(tools), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as mock:
        env = {
            "PATH": path,
            "HOME": str(home),
            "SWITCHYARD_HOME": str(tmp / "sy-home"),
            "OPENAI_BASE_URL": mock.base_url + "/v1",
            "OPENAI_API_KEY": "sk-readme-mock-0123456789",
            "OPENAI_RESPONSES": "true",  # the mock speaks Responses, as OpenAI does
            "ANTHROPIC_BASE_URL": mock.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-readme-mock-0123456789",
            "PYTHONPATH": str(REPO),
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        port = free_port()
        args = [str(shim), "serve", "--port", str(port), "--log-level", "warning"]
        server = subprocess.Popen(args, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "switchyard serve did not become ready in 60 s"
                time.sleep(0.2)
            yield Session(env, port, work)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if server.stderr:
                server.stderr.close()


@pytest.mark.parametrize("block", blocks(), ids=lambda b: f"README.md:{b.line}-{b.lang}")
def test_readme_block_runs(block: Block, session: Session) -> None:
    if block.needs == "real-provider":
        pytest.skip(f"README.md:{block.line} needs a real provider key")
    if block.needs.startswith("needs "):
        tool = block.needs.removeprefix("needs ").strip()
        if shutil.which(tool, path=session.env["PATH"]) is None:
            pytest.skip(
                f"README.md:{block.line} needs the {tool} CLI (`bash .ci/run` installs it in .tools/)"
            )
    code = block.code.replace("127.0.0.1:8080", f"127.0.0.1:{session.port}")
    dump = session.cwd / ".env-after"
    if block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", f"{code}\nenv -0 > {dump}"]
    else:
        cmd = [sys.executable, "-c", code]
    proc = subprocess.run(
        cmd,
        env=session.env,
        cwd=session.cwd,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"README.md:{block.line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"README.md:{block.line} printed nothing"
    if block.lang == "bash":
        pairs = (item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
        session.env.update({k: v for k, v in pairs if k.startswith("SWITCHYARD_")})
