"""Savings attribution and local usage estimates (the pieces Pipeline._record calls)."""

from __future__ import annotations

from decimal import Decimal

from gateway.core.types import Price, Target, Usage
from gateway.ledger.meter import estimate_usage, savings_cause

D = Decimal
PRICE = Price(D("1"), D("2"))
HOSTED = Target("mini", "openai", "gpt-4o-mini", PRICE)
ENGINE = Target("llama", "engine", "llama-8b", PRICE, self_hosted=True)


def test_savings_cause() -> None:
    assert savings_cause("hit", None, D("0"), D("1"), "big") == "exact_cache"
    assert savings_cause("semantic_hit", None, D("0"), D("1"), "big") == "semantic_cache"
    assert savings_cause("miss", ENGINE, D("0.1"), D("1"), "big") == "self_hosted"
    assert savings_cause("off", HOSTED, D("0.1"), D("1"), "big") == "routing"
    assert savings_cause("miss", HOSTED, D("1"), D("1"), "big") == "none"  # not cheaper
    assert savings_cause("miss", HOSTED, D("2"), D("1"), "big") == "none"  # dearer (a fallback)
    assert savings_cause("miss", HOSTED, D("0.5"), D("1"), "mini") == "none"  # the baseline itself
    assert savings_cause("miss", HOSTED, None, D("1"), "big") == "none"  # unpriced
    assert savings_cause("miss", HOSTED, D("0.1"), None, None) == "none"  # no baseline
    assert savings_cause("miss", None, None, None, None) == "none"  # nothing answered


def test_estimate_keeps_what_the_upstream_reported() -> None:
    body = {"messages": [{"role": "user", "content": "hello world"}]}
    completion = {"choices": [{"message": {"role": "assistant", "content": "hello world"}}]}
    full = estimate_usage(body, completion, "gpt-4o")
    assert full == Usage(9, 2, estimated=True)
    partial = estimate_usage(body, completion, "gpt-4o", Usage(input_tokens=100, cached_input_tokens=40))
    assert partial == Usage(100, 2, cached_input_tokens=40, estimated=True)
    assert estimate_usage(body, None, "gpt-4o") == Usage(9, 0, estimated=True)


def test_estimate_never_raises() -> None:
    # A body the tokenizer cannot read leaves the counts unknown (the row stays unpriced).
    weird = {"messages": [{"role": "user", "content": "x"}], "tools": {1, 2}}  # not JSON-serialisable
    usage = estimate_usage(weird, None, "gpt-4o")
    assert usage.estimated and usage.input_tokens is None
