"""The verifier cascade's built-in checks (routing/verify.py), and the cascade evaluation on
the GSM8K answers when the evaluation data is present."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.routing import verify

DATA = Path(os.environ.get("SHARED_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")


def _completion(content: str = "", tool_calls: list[dict[str, object]] | None = None) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"choices": [{"message": message}]}


def test_math_consistency() -> None:
    good = "2 * 3 = <<2*3=6>>6 apples, then 6 + 4 = <<6+4=10>>10.\n#### 10"
    assert verify.math(good) is None
    assert "no final answer" in (verify.math("2 * 3 = <<2*3=6>>6 and then") or "")
    assert "is wrong" in (verify.math("2 * 3 = <<2*3=7>>7\n#### 7") or "")
    assert "last result" in (verify.math("2 * 3 = <<2*3=6>>6\n#### 8") or "")
    assert "whole number" in (verify.math("7 / 2 = <<7/2=3.5>>3.5\n#### 3.5", "Split 7 pies in 2") or "")
    assert verify.math("7 / 2 = <<7/2=3.5>>3.5\n#### 3.5", "Split 7 pies in 2.5 ways") is None
    assert verify.math("The answer is 42.") is None  # no calculation to contradict it


def test_json_schema_tool_calls_and_refusals() -> None:
    fmt = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "required": ["a"],
           "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
    req = {"response_format": fmt}
    assert verify.check(["json", "schema"], _completion('{"a": 1}'), req) is None
    assert "not valid JSON" in (verify.check(["json"], _completion("{a: 1"), req) or "")
    assert "required key" in (verify.check(["schema"], _completion('{"b": 1}'), req) or "")
    assert "not a integer" in (verify.check(["schema"], _completion('{"a": "x"}'), req) or "")
    assert verify.check(["json"], _completion("plain text"), {}) is None  # no JSON was asked for
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert verify.check(["tool_calls"], _completion(tool_calls=[call]), {"tools": tools}) is None
    bad = {**call, "function": {"name": "get_weather", "arguments": "{city"}}
    assert "not valid JSON" in (
        verify.check(["tool_calls"], _completion(tool_calls=[bad]), {"tools": tools}) or ""
    )
    other = {**call, "function": {"name": "rm_rf", "arguments": "{}"}}
    assert "unknown tool" in (
        verify.check(["tool_calls"], _completion(tool_calls=[other]), {"tools": tools}) or ""
    )
    assert verify.check(["refusal"], _completion("I'm sorry, but I can't help with that."), {}) is not None
    assert verify.check(["refusal"], _completion("Sure: here it is."), {}) is None
    with pytest.raises(ValueError, match="unknown check"):
        verify.check(["vibes"], _completion("x"), {})


@pytest.mark.skipif(
    not (DATA / "routing" / "gsm8k-dev.jsonl").is_file(), reason="needs ../shared/data/routing"
)
def test_cascade_evaluation_on_gsm8k(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "cascade", "--data", str(DATA / "routing" / "gsm8k-dev.jsonl"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    lines = {r["line"]: r for r in result["table"]}
    cascade, weak = lines["cascade: pass/fail checks"], lines["always weak"]
    assert result["rows"] == 645
    assert weak["quality"] < cascade["quality"] < lines["always strong"]["quality"]
    assert cascade["cost_vs_strong"] < 0.5 and result["check_tpr"] > 2 * result["check_fpr"]
    # the graded check under cross-validation: escalates about the configured share, ranks the
    # weak model's wrong answers well above chance and buys quality the pass/fail check does not
    graded, power = lines["cascade: suspicion, 2-fold CV"], result["power"]["cascade: suspicion, 2-fold CV"]
    assert 0.35 < power["escalated"] < 0.45 and power["auc"] > 0.65
    assert graded["quality"] > cascade["quality"] and graded["cost_vs_strong"] < 0.6
    assert len(result["cv_spread"]["quality_vs_strong"]) == 3


@pytest.mark.skipif(
    not (DATA / "routing-multi" / "mmlu-pro.jsonl").is_file(), reason="needs ../shared/data/routing-multi"
)
def test_length_signals_on_other_math_sets(capsys: pytest.CaptureFixture[str]) -> None:
    data = str(DATA / "routing" / "gsm8k-dev.jsonl")
    assert main(["eval", "cascade", "--data", data, "--other", str(DATA / "routing-multi")]) == 0
    result = json.loads(capsys.readouterr().out)
    answer = result["mmlu-pro math: long_answer"]
    assert answer["models"] > 10 and 0.5 < answer["median"] < 0.9
    assert 0.5 < result["dcrouter math: long_question"]["median"] < 0.9


def test_eval_cascade_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "cascade", "--escalate-share", "1.5"]) == 2
    assert main(["eval", "cascade", "--checks", "vibes"]) == 2
    assert "--escalate-share" in capsys.readouterr().err
