"""Golden values for ``cost_of``, each computed by hand in the comment above it."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest

from gateway.core.types import Price, Usage
from gateway.ledger.pricing import COST_QUANTUM, cost_of, quantize_usd

D = Decimal

GPT_4O = Price(input=D("2.50"), output=D("10.00"), cached_input=D("1.25"))
SONNET = Price(input=D("3.00"), output=D("15.00"), cached_input=D("0.30"), cache_write=D("3.75"))
O_MINI = Price(input=D("1.10"), output=D("4.40"), cached_input=D("0.55"))
EMBED = Price(input=D("0.02"), output=D("0"))


def test_plain_chat() -> None:
    # 1000 x 2.50 + 200 x 10 = 2500 + 2000 = 4500 micro-USD -> 0.0045
    assert cost_of(Usage(input_tokens=1000, output_tokens=200), GPT_4O) == D("0.0045")


def test_openai_cached_tokens_are_inside_input() -> None:
    # (1000 - 400) x 2.50 = 1500; 400 x 1.25 = 500; 200 x 10 = 2000 -> 4000 / 1e6 = 0.004
    usage = Usage(input_tokens=1000, output_tokens=200, cached_input_tokens=400)
    assert cost_of(usage, GPT_4O) == D("0.0040000000")


def test_anthropic_cache_read_and_write() -> None:
    # Anthropic wire: input_tokens=100 (uncached), cache_read=2000, cache_creation=500, out=300.
    # Normalised: input = 100 + 2000 + 500 = 2600.
    # 100 x 3.00 = 300; 2000 x 0.30 = 600; 500 x 3.75 = 1875; 300 x 15 = 4500 -> 7275 -> 0.007275
    usage = Usage(input_tokens=2600, output_tokens=300, cached_input_tokens=2000, cache_write_tokens=500)
    assert cost_of(usage, SONNET) == D("0.007275")


def test_reasoning_tokens_are_priced_as_output_once() -> None:
    # output 1000 already contains 800 reasoning tokens: 50 x 1.10 + 1000 x 4.40 = 55 + 4400 = 4455
    usage = Usage(input_tokens=50, output_tokens=1000, reasoning_tokens=800)
    assert cost_of(usage, O_MINI) == D("0.004455")


def test_cached_and_write_prices_default_to_input() -> None:
    # no cached/write prices: everything at 2.00 -> 1000 x 2 + 10 x 8 = 2080 -> 0.00208
    price = Price(input=D("2"), output=D("8"))
    usage = Usage(input_tokens=1000, output_tokens=10, cached_input_tokens=600, cache_write_tokens=100)
    assert cost_of(usage, price) == D("0.00208")


def test_unknown_counts_give_none() -> None:
    assert cost_of(Usage(input_tokens=None, output_tokens=10), GPT_4O) is None
    assert cost_of(Usage(input_tokens=10, output_tokens=None), GPT_4O) is None
    assert cost_of(Usage(), GPT_4O, output_expected=False) is None


def test_embeddings_without_output() -> None:
    # 1234 x 0.02 = 24.68 micro-USD -> 0.00002468
    usage = Usage(input_tokens=1234, output_tokens=None)
    assert cost_of(usage, EMBED, output_expected=False) == D("0.00002468")


def test_zero_usage_is_zero_not_none() -> None:
    assert cost_of(Usage(input_tokens=0, output_tokens=0), GPT_4O) == D(0)


def test_never_negative_when_cached_exceeds_input() -> None:
    # input 100 but 150 cached: plain part clamps to 0; 150 x 1.25 = 187.5 -> 0.0001875
    usage = Usage(input_tokens=100, output_tokens=0, cached_input_tokens=150)
    assert cost_of(usage, GPT_4O) == D("0.0001875")
    negative = Usage(input_tokens=-5, output_tokens=-5, cached_input_tokens=-3)
    assert cost_of(negative, GPT_4O) == D(0)


def test_quantized_to_1e_10_half_even() -> None:
    price = Price(input=D("0.00005"), output=D("0"))
    # 1 token: 5e-11 -> ties to even -> 0; 3 tokens: 1.5e-10 -> 2e-10; 5: 2.5e-10 -> 2e-10
    assert cost_of(Usage(input_tokens=1, output_tokens=0), price) == D("0E-10")
    assert cost_of(Usage(input_tokens=3, output_tokens=0), price) == D("2E-10")
    assert cost_of(Usage(input_tokens=5, output_tokens=0), price) == D("2E-10")
    assert quantize_usd(D("0.00000000015")) == D("2E-10")


@pytest.mark.parametrize(
    "usage",
    [
        Usage(input_tokens=1, output_tokens=1),
        Usage(input_tokens=123_456_789, output_tokens=98_765, cached_input_tokens=100_000),
        Usage(input_tokens=0, output_tokens=0),
    ],
)
def test_exponent_is_always_minus_10(usage: Usage) -> None:
    cost = cost_of(usage, SONNET)
    assert cost is not None
    assert cost.as_tuple().exponent == COST_QUANTUM.as_tuple().exponent == -10


def test_independent_of_callers_decimal_context() -> None:
    usage = Usage(input_tokens=123_456_789, output_tokens=987_654)
    expected = cost_of(usage, SONNET)
    with localcontext() as ctx:
        ctx.prec = 3
        assert cost_of(usage, SONNET) == expected
    # 123456789 x 3 + 987654 x 15 = 370370367 + 14814810 = 385185177 -> 385.185177
    assert expected == D("385.185177")
