"""The real Codex CLI (npm ``@openai/codex``, ``codex exec``) through Switchyard's
``/v1/responses`` to the mock chat upstream: a custom model provider (``wire_api =
"responses"``) whose base_url is the gateway and whose key is a Switchyard key. Codex's own
requests (streamed, ~30 function tools, a ``namespace`` tool, developer messages, reasoning,
``include``, ``prompt_cache_key``) are translated to chat; the mock calls Codex's first tool,
Codex answers the call, the mock answers with text and the turn completes. ``.ci/run``
installs the pinned CLI under ``.tools/``; elsewhere the test skips with the install command
(under CI=true a missing CLI fails)."""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

from load_tests.mock_upstream import MockUpstream
from tests.agent_cli import cli_binary
from tests.gateway_harness import RunningGateway

CODEX_VERSION = "0.169.0"


def codex_binary() -> str:
    return cli_binary("codex", "@openai/codex", CODEX_VERSION)


def run_codex(gw: RunningGateway, tmp_path: Path, prompt: str) -> list[dict[str, Any]]:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(home), "SY_KEY": gw.key()}
    config = [
        "model_provider=switchyard",
        "model_providers.switchyard.name=Switchyard",
        f'model_providers.switchyard.base_url="{gw.base_url}"',
        "model_providers.switchyard.env_key=SY_KEY",
        "model_providers.switchyard.wire_api=responses",
        "web_search=disabled",  # a built-in tool a chat upstream cannot run (the gateway says 400)
    ]
    args = [codex_binary(), "exec", "--json", "--skip-git-repo-check", "-s", "read-only", "-m", "small"]
    for c in config:
        args += ["-c", c]
    proc = subprocess.run(
        [*args, prompt],
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_codex_exec_completes_a_turn(gateway: RunningGateway, mock: MockUpstream, tmp_path: Path) -> None:
    events = run_codex(gateway, tmp_path, "say hello")
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages == ["echo: say hello pad pad pad pad pad"]
    assert events[-1]["type"] == "turn.completed" and events[-1]["usage"]["output_tokens"] > 0
    sent = [r["body"] for r in mock.requests() if r["path"].endswith("/chat/completions")]
    assert len(sent) == 2  # the tool call, then the answer to Codex's function_call_output
    names = {t["function"]["name"] for t in sent[0]["tools"]}
    assert "exec_command" in names and "close_agent" in names  # a namespace's tools, flattened
    assert sent[0]["messages"][0]["role"] == "system" and sent[0]["stream"] is True
    assert sent[1]["messages"][-1]["role"] == "tool"
    rows = gateway.ledger_rows()
    assert [(r["endpoint"], r["status"], r["stream"]) for r in rows] == [("responses", "ok", 1)] * 2
    assert all(Decimal(str(r["cost_usd"])) > 0 for r in rows)
    assert sum(r["input_tokens"] for r in rows) == events[-1]["usage"]["input_tokens"]
