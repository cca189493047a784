"""`switchyard policy simulate`: how a request would be routed, without sending it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

POLICY = """
providers:
  a: {type: openai, base_url: "http://127.0.0.1:9/v1", api_key: k}
  b: {type: anthropic, base_url: "http://127.0.0.1:9", api_key: "${NO_SUCH_KEY_FOR_TEST:-}"}
models:
  cheap: {provider: a, upstream: cheap-v2, price: {input: 0.1, output: 0.4}}
  strong: {provider: b, price: {input: 3, output: 15}}
  mid: {provider: a, price: {input: 1, output: 4}}
routes:
  auto:
    targets: [cheap, strong, mid]
    baseline: strong
    params: {max: {temperature: 1.0}, pinned: {top_p: 0.5}}
tenants:
  interns: {models: [cheap]}
"""


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_simulate_shows_order_skips_and_params(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "policy",
            "simulate",
            str(policy_file),
            "--model",
            "auto",
            "--body",
            '{"temperature": 1.7}',
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert [t["model"] for t in result["targets"]] == ["cheap", "mid"]
    assert result["targets"][0]["upstream_model"] == "cheap-v2"
    assert result["skipped_providers_without_key"] == ["b"]
    assert result["baseline"] == "strong"
    assert result["params_sent"] == {"temperature": 1.0, "top_p": 0.5}


def test_simulate_refuses_what_the_gateway_would(
    policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "simulate", str(policy_file), "--model", "auto", "--tenant", "interns"]) == 1
    assert "403" in capsys.readouterr().err
    assert main(["policy", "simulate", str(policy_file), "--model", "gpt-9"]) == 1
    assert "404" in capsys.readouterr().err
    assert main(["policy", "simulate", str(policy_file), "--model", "auto", "--body", "{nope"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
