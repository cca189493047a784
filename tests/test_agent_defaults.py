"""Agents on the shipped default policy, unedited, with their own default model names: the real
Claude Code CLI (headless), the real Codex CLI (``codex exec``) and the OpenAI Agents SDK. The
providers point at the mock upstream through the environment the policy reads
(ANTHROPIC_BASE_URL, OPENAI_BASE_URL and their keys). The ledger keeps the name the client sent
and the model that answered; a name nothing maps is a 404 that lists what is served and the alias
line to add."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.conftest import service_unavailable
from tests.gateway_harness import RunningGateway, start_gateway
from tests.test_claude_code import claude_binary
from tests.test_responses_codex import codex_binary

DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningGateway]:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", mock.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-canary-default-policy-0123")
    monkeypatch.setenv("OPENAI_BASE_URL", mock.base_url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-default-policy-0123")
    monkeypatch.setenv("OPENAI_RESPONSES", "true")  # the mock speaks Responses, as OpenAI does
    gateway = start_gateway(tmp_path, DEFAULT_POLICY.read_text())
    try:
        yield gateway
    finally:
        gateway.stop()


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )


def _served(gw: RunningGateway) -> set[tuple[str, str | None, str]]:
    return {(r["requested_model"], r["served_model"], r["status"]) for r in gw.ledger_rows()}


def test_claude_code_with_its_default_model(gw: RunningGateway, mock: MockUpstream, tmp_path: Path) -> None:
    home = tmp_path / "claude-home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.key(),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    proc = _run(
        [claude_binary(), "-p", "say hello", "--output-format", "json", "--tools", ""], env, tmp_path / "w"
    )
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    result = json.loads(proc.stdout)
    assert result["subtype"] == "success" and not result["is_error"] and result["result"]
    sent = {q["body"]["model"] for q in mock.requests() if q["path"].endswith("/v1/messages")}
    assert sent == {"claude-opus-5-5"}  # the CLI's own default, served as itself
    rows = gw.ledger_rows()
    assert rows and all(r["status"] == "ok" and r["provider"] == "anthropic" for r in rows)
    assert all(Decimal(str(r["cost_usd"])) > 0 for r in rows)


def test_codex_with_its_default_model(gw: RunningGateway, mock: MockUpstream, tmp_path: Path) -> None:
    """Codex's documented way to use a gateway: a model provider speaking Responses, whose key is
    a Switchyard key; no ``-m``, so Codex asks for its own default model."""
    home = tmp_path / "codex-home"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "CODEX_HOME": str(home), "SY_KEY": gw.key()}
    config = [
        "model_provider=switchyard",
        "model_providers.switchyard.name=Switchyard",
        f'model_providers.switchyard.base_url="{gw.base_url}"',
        "model_providers.switchyard.env_key=SY_KEY",
        "model_providers.switchyard.wire_api=responses",
        "web_search=disabled",
    ]
    args = [codex_binary(), "exec", "--json", "--skip-git-repo-check", "-s", "read-only"]
    for c in config:
        args += ["-c", c]
    proc = _run([*args, "say hello"], env, tmp_path / "w")
    assert proc.returncode == 0, proc.stdout[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed", events[-3:]
    rows = [r for r in gw.ledger_rows() if r["endpoint"] == "responses"]
    assert rows and {(r["requested_model"], r["served_model"], r["status"]) for r in rows} == {
        ("gpt-6.1-sol", "gpt-6.1-sol", "ok")
    }
    sent = [q["body"] for q in mock.requests() if q["path"].endswith("/v1/responses")]
    assert sent and {b["model"] for b in sent} == {"gpt-6.1-sol"}
    assert sent[0]["input"][0]["type"] == "additional_tools"  # passed through unchanged


def test_claude_agent_sdk_with_its_default_model(
    gw: RunningGateway, mock: MockUpstream, tmp_path: Path
) -> None:
    """The Claude Agent SDK (it drives the Claude Code CLI) with no model named."""
    try:
        sdk = importlib.import_module("claude_agent_sdk")
    except ImportError:
        service_unavailable("claude-agent-sdk", "pip install -e '.[dev]' installs it")
    home = tmp_path / "sdk-home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.key(),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    options = sdk.ClaudeAgentOptions(
        cli_path=claude_binary(), env=env, cwd=str(tmp_path), tools=[], max_turns=1
    )

    async def run() -> list[Any]:
        return [m async for m in sdk.query(prompt="say hello", options=options)]

    messages = asyncio.run(run())
    results = [m for m in messages if isinstance(m, sdk.ResultMessage)]
    assert results and not results[-1].is_error and results[-1].result
    sent = {q["body"]["model"] for q in mock.requests() if q["path"].endswith("/v1/messages")}
    assert sent == {"claude-opus-5-5"}
    assert {(r["requested_model"], r["status"]) for r in gw.ledger_rows()} == {("claude-opus-5-5", "ok")}


def test_openai_agents_sdk_with_its_default_model(gw: RunningGateway) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from agents.models.default_models import get_default_model

    set_tracing_disabled(True)

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0)
        try:
            model = OpenAIResponsesModel(model=get_default_model(), openai_client=client)
            agent = Agent(name="hello", instructions="Be brief.", model=model)
            return str((await Runner.run(agent, "say hello")).final_output)
        finally:
            await client.close()

    default = get_default_model()
    assert asyncio.run(run()).startswith("echo:")
    assert _served(gw) == {(default, "gpt-6-luna", "ok")}  # gpt-*-luna -> the current Luna


@pytest.mark.parametrize(
    ("asked", "served"),
    [
        ("claude-opus-4-1", "claude-opus-5-5"),
        ("claude-sonnet-4-6", "claude-sonnet-5-5"),
        ("claude-sonnet", "claude-sonnet-5-5"),
        ("claude-haiku-5-5-20261001", "claude-haiku-5-5"),
        ("claude-haiku-4-5", "claude-haiku-4-5"),  # a catalog model is served as itself
    ],
)
def test_claude_families_map_to_their_siblings(gw: RunningGateway, asked: str, served: str) -> None:
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.key(), max_retries=0) as client:
        msg = client.messages.create(model=asked, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].type == "text"
    assert _served(gw) == {(asked, served, "ok")}


def test_codex_models_go_to_the_code_route(gw: RunningGateway) -> None:
    with openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0) as client:
        client.responses.create(model="gpt-5.3-codex", input="hi")
    (row,) = gw.ledger_rows()
    assert (row["requested_model"], row["route"], row["served_model"]) == (
        "gpt-5.3-codex",
        "code",
        "gpt-6.1-sol",
    )


def test_an_unmapped_name_is_a_404_listing_what_is_served(gw: RunningGateway) -> None:
    with (
        openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0) as client,
        pytest.raises(openai.NotFoundError) as err,
    ):
        client.chat.completions.create(model="llama-9", messages=[{"role": "user", "content": "hi"}])
    body: Any = err.value.body
    message = body["message"]
    assert message.startswith("The model 'llama-9' is not served by this gateway. Served chat models: auto,")
    assert "gpt-6.1-sol" in message and "text-embedding-3-small" not in message  # chat models only
    assert message.endswith('To serve it, add to the policy\'s aliases: "llama-9": auto')
    (row,) = gw.ledger_rows()
    assert (row["requested_model"], row["status"], row["error_code"]) == (
        "llama-9",
        "error",
        "model_not_found",
    )


def test_a_system_message_inside_the_conversation(gw: RunningGateway, mock: MockUpstream) -> None:
    """Claude Code sends a system-role message after the first user turn: passed through to an
    Anthropic upstream as it is, and a system message in place for a chat upstream."""
    msgs = [
        {"role": "user", "content": "say hello"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        {"role": "user", "content": "again"},
    ]
    headers = {"anthropic-version": "2023-06-01"}
    for model in ("claude-opus-5-5", "gpt-6-luna"):
        r = gw.post("/v1/messages", {"model": model, "max_tokens": 16, "messages": msgs}, headers=headers)
        assert r.status_code == 200, r.text
    (native,) = [q["body"] for q in mock.requests() if q["path"].endswith("/v1/messages")]
    assert native["messages"] == msgs
    (chat,) = [q["body"] for q in mock.requests() if q["path"].endswith("/chat/completions")]
    assert [m["role"] for m in chat["messages"]] == ["user", "system", "user"]
    assert chat["messages"][1]["content"] == "# Environment"
