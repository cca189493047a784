"""Compression measured on real agent traffic: Claude Code (``claude -p``, a tool-use turn)
and Codex (``codex exec``) run through the gateway against the mock upstream; the request
bodies the upstream received are measured as sent and as lossless compression sends them
(load_tests/compression_eval.py): tokens saved, and the prompt-cache hit share, which must not
drop. Then the same Claude Code turn on a route with compression on: the step runs live (the
ledger's ``compressed_tokens``) and the cached tokens the upstream reports stay. The figures
are printed (``-s``). The CLIs come from ``.tools/`` (skipped without them, as the CLI tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from load_tests.compression_eval import evaluate
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway
from tests.test_claude_code import run_claude
from tests.test_responses_codex import run_codex

ROUTES = """  squeezed-claude:
    targets: [claude, small]
    compression: {lossless: true}
"""


def _gateway(tmp: Path, mock: MockUpstream, alias: str) -> RunningGateway:
    policy = mock_policy(mock.base_url, f'\naliases:\n  "claude-*": {alias}\n').replace(
        "routes:\n", "routes:\n" + ROUTES, 1
    )
    return start_gateway(tmp, policy)


def _data(work: Path) -> None:
    """A pretty-printed JSON file for the agents' tools to read (as agents cat manifests, API
    answers, test reports)."""
    work.mkdir(parents=True, exist_ok=True)
    data = {"packages": [{"name": f"pkg-{i}", "version": f"1.{i}.0", "license": "MIT", "deps": [f"pkg-{j}" for j in range(i % 5)],
                          "scripts": {"test": "pytest -q", "lint": "ruff check ."}} for i in range(25)]}  # fmt: skip
    (work / "data.json").write_text(json.dumps(data, indent=2))


CLAUDE_ASK = (
    'Summarise data.json. mock-tool: Bash {"command": "cat data.json", "description": "Show data.json"}'
)
CODEX_ASK = 'Summarise data.json. mock-tool: exec_command {"cmd": "cat data.json"}'


def _report(name: str, result: dict[str, Any]) -> None:
    print(f"\n{name}: {json.dumps(result)}")


def test_claude_code_and_codex_bodies(tmp_path: Path, mock: MockUpstream) -> None:
    for side in ("off", "on"):
        _data(tmp_path / side / "work")
    g = _gateway(tmp_path / "off", mock, "anthropic-first")
    try:
        run_claude(g, tmp_path / "off", "--allowedTools", "Bash", prompt=CLAUDE_ASK)
        claude = [r["body"] for r in mock.requests() if r["path"].endswith("/v1/messages")]
        mock.state.clear_requests()
        run_codex(g, tmp_path / "off", CODEX_ASK)
        codex = [r["body"] for r in mock.requests() if r["path"].endswith("/chat/completions")]
        off_rows = [r for r in g.ledger_rows() if r["endpoint"] == "messages"]
    finally:
        g.stop()
    assert len(claude) >= 2 and len(codex) >= 2
    for name, bodies in (("claude-code", claude), ("codex", codex)):
        result = evaluate(bodies)
        _report(name, result)
        assert result["saved_tokens"] > 300, "the tool's JSON output was minified"
        assert result["after"]["cached_tokens"] >= result["before"]["cached_tokens"] - result["saved_tokens"]
        assert result["after"]["cached_share"] >= result["before"]["cached_share"] - 0.01  # the prefix holds
        lossy = evaluate(bodies, lossless=True, trim_after=0)
        _report(name + " (lossy, every tool output trimmed)", lossy)
    mock.state.reset()
    g = _gateway(tmp_path / "on", mock, "squeezed-claude")
    try:
        run_claude(g, tmp_path / "on", "--allowedTools", "Bash", prompt=CLAUDE_ASK)
        on_rows = [r for r in g.ledger_rows() if r["endpoint"] == "messages"]
    finally:
        g.stop()
    assert on_rows and all(r["compressed_tokens"] is not None for r in on_rows)
    assert sum(r["compressed_tokens"] for r in on_rows) > 300
    share = {
        k: sum(r["cached_tokens"] or 0 for r in rows) / max(1, sum(r["input_tokens"] or 0 for r in rows))
        for k, rows in (("off", off_rows), ("on", on_rows))
    }
    _report("claude-code live", {"compressed_tokens": [r["compressed_tokens"] for r in on_rows],
                                 "cached_share_ledger": share})  # fmt: skip
    assert share["on"] >= share["off"] - 0.01
