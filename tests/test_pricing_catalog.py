"""The built-in price catalog, policy overrides, engine calibrations, and missing prices."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.config.catalog import builtin_catalog, parse_catalog, read_calibration
from gateway.config.loader import PolicyError, load_policy, parse_policy
from gateway.config.policy import PricePolicy
from gateway.routing.router import Router

D = Decimal

PROVIDERS = """
providers:
  openai: {type: openai, base_url: "https://api.openai.com/v1", api_key: sk-x}
  anthropic: {type: anthropic, base_url: "https://api.anthropic.com", api_key: sk-y}
  groq: {type: openai, base_url: "https://api.groq.com/openai/v1", api_key: gsk-z}
  engine: {type: openai, base_url: "http://127.0.0.1:8000/v1", key_required: false, self_hosted: true}
"""

CALIBRATION = {
    "profile": "llama-8b-awq",
    "gpu": "NVIDIA H200",
    "gpu_usd_per_hour": "2.49",
    "prompt_tokens_per_s": 41000.5,
    "generation_tokens_per_s": 3100.25,
    "price_usd_per_1m": {"input": "0.1", "cached_input": "0.01", "output": "0.5"},
    "measured_at": "2026-11-30T05:00:00Z",
}


def test_catalog_is_dated_and_covers_the_major_vendors() -> None:
    cat = builtin_catalog()
    assert date.fromisoformat(cat.as_of) <= date.today()
    hosts = {e.host for e in cat.entries.values()}
    assert {"openai", "anthropic", "google", "mistral", "deepseek", "together", "groq", "fireworks"} <= hosts
    for entry in cat.entries.values():
        p = entry.price
        assert p.input >= 0 and p.output >= 0, entry.model
        if p.cached_input is not None:
            assert p.cached_input <= p.input, entry.model
    cent = D("0.0125")  # Anthropic publishes rounded rates (claude-3-haiku: writes $0.30, not 0.3125)
    for entry in (e for e in cat.entries.values() if e.host == "anthropic"):
        p = entry.price
        assert p.cache_write is not None and p.cache_write_1h is not None and p.cached_input is not None
        assert abs(p.cache_write - p.input * D("1.25")) <= cent, entry.model  # 5-minute writes
        assert abs(p.cache_write_1h - p.input * 2) <= cent, entry.model  # 1-hour writes
        assert p.cached_input <= p.input / 10 + cent, entry.model  # reads: 0.1x (0.05x from Opus/Sonnet 5.5)


def test_lookup_strips_dated_snapshots() -> None:
    cat = builtin_catalog()
    assert cat.lookup("gpt-4o-2024-08-06") == cat.lookup("gpt-4o")
    assert cat.lookup("claude-sonnet-4-5-20250929") == cat.lookup("claude-sonnet-4-5")
    assert cat.lookup("gpt-4o-mini") is not None and cat.lookup("gpt-4o-mini") != cat.lookup("gpt-4o")
    assert cat.lookup("no-such-model-2024-01-01") is None


def test_policy_without_price_takes_the_catalog_price() -> None:
    policy = parse_policy(
        PROVIDERS
        + """
models:
  fast: {provider: openai, upstream: gpt-4o-mini-2024-07-18}
  claude-sonnet-4-5: {provider: anthropic}
  llama: {provider: groq, upstream: llama-3.3-70b-versatile}
routes:
  r: {targets: [fast, llama]}
"""
    )
    assert policy.models["fast"].price == PricePolicy(
        input=D("0.15"), output=D("0.60"), cached_input=D("0.075"), batch=D("0.5")
    )  # the catalog's batch share for OpenAI models (their Batch API: half price)
    sonnet = policy.models["claude-sonnet-4-5"].price
    assert sonnet is not None and (sonnet.cache_write, sonnet.cache_write_1h) == (D("3.75"), D("6.00"))
    assert policy.models["llama"].price == PricePolicy(input=D("0.59"), output=D("0.79"))  # no batch API
    target = Router(policy).plan("r", _principal(), "chat").targets[0]
    assert target.price.input == D("0.15") and not target.self_hosted


def test_policy_price_overrides_the_catalog() -> None:
    policy = parse_policy(PROVIDERS + "models:\n  gpt-4o: {provider: openai, price: {input: 1, output: 2}}\n")
    assert policy.models["gpt-4o"].price == PricePolicy(input=D("1"), output=D("2"))


def test_no_price_anywhere_is_a_policy_error_never_zero() -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(PROVIDERS + "models:\n  mystery: {provider: openai, upstream: my-finetune-v3}\n")
    assert err.value.problems == [
        (
            "models.mystery.price",
            f"no price for 'my-finetune-v3': not in the built-in catalog (as of {builtin_catalog().as_of}); "
            "set price",
        )
    ]


def test_self_hosted_models_never_take_a_catalog_price() -> None:
    # gpt-4o is in the catalog, but this one runs on our own engine.
    with pytest.raises(PolicyError) as err:
        parse_policy(PROVIDERS + "models:\n  gpt-4o: {provider: engine}\n")
    ((path, message),) = err.value.problems
    assert path == "models.gpt-4o.price" and "price_calibration" in message


def test_price_calibration_relative_to_the_policy_file(tmp_path: Path) -> None:
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "llama.json").write_text(json.dumps(CALIBRATION))
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        PROVIDERS
        + """
models:
  llama-8b: {provider: engine, upstream: meta-llama/Llama-3.1-8B-Instruct, price_calibration: cal/llama.json}
routes:
  r: {targets: [llama-8b]}
"""
    )
    policy = load_policy(policy_file)
    assert policy.models["llama-8b"].price == PricePolicy(
        input=D("0.1"), cached_input=D("0.01"), output=D("0.5")
    )
    target = Router(policy).plan("r", _principal(), "chat").targets[0]
    assert target.self_hosted and target.price.output == D("0.5")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read calibration file"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**CALIBRATION, "price_usd_per_1m": None}), "expected an object"),
        (
            json.dumps({k: v for k, v in CALIBRATION.items() if k != "price_usd_per_1m"}),
            "missing 'price_usd_per_1m'",
        ),
        (json.dumps({**CALIBRATION, "price_usd_per_1m": {"input": "0.1"}}), "missing output"),
        (
            json.dumps({**CALIBRATION, "price_usd_per_1m": {"input": "-1", "output": "1"}}),
            "must be a finite number >= 0",
        ),
        (
            json.dumps({**CALIBRATION, "price_usd_per_1m": {"input": "abc", "output": "1"}}),
            "is not a decimal number",
        ),
        (
            json.dumps({**CALIBRATION, "price_usd_per_1m": {"input": 0.1, "output": "1"}}),
            "expected a decimal string",
        ),
    ],
)
def test_bad_calibration_is_a_clear_policy_error(tmp_path: Path, content: str | None, reason: str) -> None:
    cal = tmp_path / "cal.json"
    if content is not None:
        cal.write_text(content)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(PROVIDERS + "models:\n  m: {provider: engine, price_calibration: cal.json}\n")
    with pytest.raises(PolicyError) as err:
        load_policy(policy_file)
    ((path, message),) = err.value.problems
    assert path == "models.m.price_calibration"
    assert reason in message and str(cal) in message


def test_read_calibration_accepts_engine_output(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(CALIBRATION))
    assert read_calibration(path).input == D("0.1")


def test_parse_catalog_rejects_malformed_data() -> None:
    with pytest.raises(ValueError, match="as_of"):
        parse_catalog({"models": {}})
    with pytest.raises(ValueError, match=r"models\.x: missing output"):
        parse_catalog({"as_of": "2025-01-01", "models": {"x": {"input": "1"}}})


def _principal():  # type: ignore[no-untyped-def]
    from gateway.core.types import Principal

    return Principal("t")
