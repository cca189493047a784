"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``, headless ``claude -p``) through
Switchyard to the mock Anthropic upstream: a plain turn and a tool-use turn, with the ledger
rows and costs. Its requests are the real ones (~50 KB, many betas, adaptive thinking,
cache_control). ``.ci/run`` installs the pinned CLI under ``.tools/``; elsewhere the tests
skip with the install command (under CI=true a missing CLI fails)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from load_tests.mock_upstream import MockUpstream
from tests.agent_cli import cli_binary
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

CLAUDE_VERSION = "2.1.332"


def claude_binary() -> str:
    return cli_binary("claude", "@anthropic-ai/claude-code", CLAUDE_VERSION)


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path, mock_policy(mock.base_url, '\naliases:\n  "claude-*": anthropic-first\n')
    )
    try:
        yield gateway
    finally:
        gateway.stop()


def run_claude(gw: RunningGateway, tmp_path: Path, *extra: str, prompt: str = "say hello") -> dict[str, Any]:
    home, work = tmp_path / "claude-home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.key(),  # a Switchyard key, never a real Anthropic one
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [claude_binary(), "-p", prompt, "--output-format", "json", *extra]
    proc = subprocess.run(
        cmd, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def message_rows(gw: RunningGateway) -> list[dict[str, Any]]:
    return [r for r in gw.ledger_rows() if r["endpoint"] == "messages"]


def test_a_plain_turn(gw: RunningGateway, mock: MockUpstream, tmp_path: Path) -> None:
    result = run_claude(gw, tmp_path, "--tools", "")
    assert result["subtype"] == "success" and not result["is_error"] and result["result"]
    rows = message_rows(gw)
    assert rows and all(r["status"] == "ok" and r["route"] == "anthropic-first" for r in rows)
    assert all(Decimal(r["cost_usd"]) > 0 and r["provider"] == "mock-anthropic" for r in rows)
    sent = [q for q in mock.requests() if q["path"].endswith("/v1/messages")]
    assert sent and "claude-code" in sent[0]["headers"].get("anthropic-beta", "")  # betas forwarded


def test_a_tool_use_turn(gw: RunningGateway, mock: MockUpstream, tmp_path: Path) -> None:
    result = run_claude(gw, tmp_path)
    assert result["subtype"] == "success" and result["num_turns"] >= 2
    bodies = [q["body"] for q in mock.requests() if q["path"].endswith("/v1/messages")]
    results = [b for b in bodies if any(
        isinstance(c, dict) and c.get("type") == "tool_result"
        for c in (b["messages"][-1].get("content") if isinstance(b["messages"][-1].get("content"), list) else [])
    )]  # fmt: skip
    assert results, "Claude Code sent the tool's result back"
    assert max(len(json.dumps(b)) for b in bodies) > 20_000  # the real, large agent requests
    rows = message_rows(gw)
    assert len(rows) >= 2 and all(r["status"] == "ok" for r in rows)
    assert any((r["cached_tokens"] or 0) > 0 for r in rows[1:]), "the second call reads the prompt cache"
