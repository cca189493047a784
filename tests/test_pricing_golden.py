"""Golden pricing cases, worked out by hand: vendor usage JSON -> Usage -> USD.

Each expected cost is written as the sum it comes from (USD per 1M tokens), so a reader can
check it with a pencil. Prices are the built-in catalog's (as of its date).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from gateway.config.catalog import builtin_catalog
from gateway.config.policy import PricePolicy
from gateway.core.types import Price, Usage, usage_from_anthropic, usage_from_openai
from gateway.ledger.pricing import cost_of

D = Decimal


def catalog_price(model: str) -> Price:
    entry = builtin_catalog().lookup(model)
    assert entry is not None, model
    p: PricePolicy = entry.price
    return Price(p.input, p.output, p.cached_input, p.cache_write, p.cache_write_1h)


def test_catalog_prices_used_below() -> None:
    # The rates the hand computations below rely on.
    assert catalog_price("gpt-4o") == Price(D("2.50"), D("10.00"), D("1.25"), None, None)
    assert catalog_price("o3") == Price(D("2.00"), D("8.00"), D("0.50"), None, None)
    assert catalog_price("claude-sonnet-4-5") == Price(D("3.00"), D("15.00"), D("0.30"), D("3.75"), D("6.00"))


def test_openai_prompt_tokens_details_cached_tokens() -> None:
    raw = {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    usage = usage_from_openai(raw)
    assert usage == Usage(2006, 300, cached_input_tokens=1920, reasoning_tokens=0)
    # (2006 - 1920) x 2.50 + 1920 x 1.25 + 300 x 10.00 = 215 + 2400 + 3000 = 5615 per 1M
    assert cost_of(usage, catalog_price("gpt-4o")) == D("0.0056150000")


def test_openai_reasoning_tokens_billed_once_as_output() -> None:
    raw = {
        "prompt_tokens": 1000,
        "completion_tokens": 1500,  # includes the 1200 reasoning tokens
        "total_tokens": 2500,
        "completion_tokens_details": {"reasoning_tokens": 1200, "accepted_prediction_tokens": 0},
    }
    usage = usage_from_openai(raw)
    assert usage is not None and usage.reasoning_tokens == 1200 and usage.output_tokens == 1500
    # 1000 x 2.00 + 1500 x 8.00 = 2000 + 12000 = 14000 per 1M (not 1500 + 1200 output tokens)
    assert cost_of(usage, catalog_price("o3")) == D("0.0140000000")


def test_deepseek_prompt_cache_hit_tokens() -> None:
    raw = {"prompt_tokens": 5000, "completion_tokens": 100, "prompt_cache_hit_tokens": 4000}
    usage = usage_from_openai(raw)
    assert usage is not None and usage.cached_input_tokens == 4000
    # 1000 x 0.28 + 4000 x 0.028 + 100 x 0.42 = 280 + 112 + 42 = 434 per 1M
    assert cost_of(usage, catalog_price("deepseek-chat")) == D("0.0004340000")


def test_anthropic_cache_read_and_creation_not_charged_twice() -> None:
    raw = {
        "input_tokens": 50,  # Anthropic counts uncached input apart from cache reads/writes
        "cache_read_input_tokens": 10_000,
        "cache_creation_input_tokens": 3000,
        "output_tokens": 400,
    }
    usage = usage_from_anthropic(raw)
    assert usage == Usage(13_050, 400, cached_input_tokens=10_000, cache_write_tokens=3000)
    # 50 x 3.00 + 10000 x 0.30 + 3000 x 3.75 (5-minute writes) + 400 x 15.00
    # = 150 + 3000 + 11250 + 6000 = 20400 per 1M
    assert cost_of(usage, catalog_price("claude-sonnet-4-5")) == D("0.0204000000")


def test_anthropic_ephemeral_5m_and_1h_cache_writes() -> None:
    raw = {
        "input_tokens": 50,
        "cache_read_input_tokens": 10_000,
        "cache_creation_input_tokens": 3000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
        "output_tokens": 400,
    }
    usage = usage_from_anthropic(raw)
    assert usage is not None
    assert (usage.input_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens) == (13_050, 3000, 2000)
    # 50 x 3.00 + 10000 x 0.30 + 1000 x 3.75 (1.25x) + 2000 x 6.00 (2x) + 400 x 15.00
    # = 150 + 3000 + 3750 + 12000 + 6000 = 24900 per 1M
    assert cost_of(usage, catalog_price("claude-sonnet-4-5")) == D("0.0249000000")


def test_anthropic_cache_creation_split_without_total() -> None:
    # Only the split is reported: its sum is the cache write count.
    usage = usage_from_anthropic(
        {"input_tokens": 10, "output_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": 100}}
    )
    assert usage == Usage(110, 1, cache_write_tokens=100, cache_write_1h_tokens=100)
    # 10 x 1.00 + 100 x 2.00 + 1 x 5.00 = 215 per 1M (claude-haiku-4-5)
    assert cost_of(usage, catalog_price("claude-haiku-4-5")) == D("0.0002150000")


def test_1h_writes_fall_back_to_cache_write_rate_then_input() -> None:
    usage = Usage(1000, 0, cache_write_tokens=1000, cache_write_1h_tokens=400)
    with_write = Price(D("1"), D("1"), cache_write=D("2"))
    # 600 x 2 + 400 x 2 (no 1h rate: the cache-write rate) = 2000 per 1M
    assert cost_of(usage, with_write) == D("0.0020000000")
    # nothing but input: 1000 x 1
    assert cost_of(usage, Price(D("1"), D("1"))) == D("0.0010000000")


@pytest.mark.parametrize("w1h", [5000, -3])
def test_1h_writes_are_capped_and_never_negative(w1h: int) -> None:
    usage = Usage(1000, 0, cache_write_tokens=1000, cache_write_1h_tokens=w1h)
    price = Price(D("1"), D("0"), cache_write=D("1.25"), cache_write_1h=D("2"))
    expected = D("0.0020000000") if w1h > 0 else D("0.0012500000")
    assert cost_of(usage, price) == expected
