"""Hypothesis properties of the two pure functions money and privacy rest on: the canonical
exact-cache key (gateway/cache/keys.py) and pricing (gateway/ledger/pricing.py)."""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.cache.keys import _NOT_IN_KEY, canonical_key
from gateway.core.types import Price, Usage
from gateway.ledger.pricing import COST_QUANTUM, cost_of

PROPS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# ----------------------------------------------------------------------------- cache keys
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
names = st.text(min_size=1, max_size=12)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=4,
)
# fields that change an answer: the well-known ones and any unknown field (passed upstream)
ANSWER_FIELDS = [
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "n",
    "tools",
    "tool_choice",
    "response_format",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "some_vendor_extension",
]
bodies = st.fixed_dictionaries(
    {"model": names, "messages": messages},
    optional={f: json_values for f in ANSWER_FIELDS if f not in ("model", "messages")},
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def normalised(field: str, value: Any) -> Any:
    floats = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
    if field in floats and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@PROPS
@given(body=bodies, tenant=names, route=names, seed=st.integers())
def test_key_ignores_object_key_order(body: dict[str, Any], tenant: str, route: str, seed: int) -> None:
    other = shuffled(body, random.Random(seed))
    assert canonical_key(tenant, route, "chat", body) == canonical_key(tenant, route, "chat", other)


@PROPS
@given(body=bodies, field=st.sampled_from(ANSWER_FIELDS), new=json_values, tenant=names)
def test_key_changes_with_every_answer_changing_field(
    body: dict[str, Any], field: str, new: Any, tenant: str
) -> None:
    old = body.get(field, "<absent>")
    assume(repr(normalised(field, new)) != repr(normalised(field, old)))
    changed = {**body, field: new}
    assert canonical_key(tenant, "r", "chat", body) != canonical_key(tenant, "r", "chat", changed)


@PROPS
@given(body=bodies, field=st.sampled_from(sorted(_NOT_IN_KEY)), value=json_values)
def test_key_ignores_transport_fields(body: dict[str, Any], field: str, value: Any) -> None:
    assert canonical_key("t", "r", "chat", body) == canonical_key("t", "r", "chat", {**body, field: value})


@PROPS
@given(body=bodies, a=names, b=names)
def test_key_separates_tenants(body: dict[str, Any], a: str, b: str) -> None:
    assume(a != b)
    assert canonical_key(a, "r", "chat", body) != canonical_key(b, "r", "chat", body)


@PROPS
@given(body=bodies, tenant=names, a=names, b=names)
def test_key_separates_routes_and_endpoints(body: dict[str, Any], tenant: str, a: str, b: str) -> None:
    assume(a != b)
    assert canonical_key(tenant, a, "chat", body) != canonical_key(tenant, b, "chat", body)
    assert canonical_key(tenant, a, "chat", body) != canonical_key(tenant, a, "completions", body)


def test_tenant_and_route_cannot_be_spliced() -> None:
    """("a|b", "c") and ("a", "b|c") must not collide: fields are framed, not concatenated."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert canonical_key("a:b", "c", "chat", body) != canonical_key("a", "b:c", "chat", body)
    assert canonical_key("ab", "c", "chat", body) != canonical_key("a", "bc", "chat", body)


# ----------------------------------------------------------------------------- pricing
counts = st.one_of(st.none(), st.integers(-1000, 10**9))
rates = st.decimals(min_value=0, max_value=1000, places=4, allow_nan=False, allow_infinity=False)
prices = st.builds(
    Price, input=rates, output=rates, cached_input=st.none() | rates, cache_write=st.none() | rates
)
usages = st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    cached_input_tokens=counts,
    cache_write_tokens=counts,
)


@PROPS
@given(usage=usages, price=prices)
def test_cost_is_none_or_a_non_negative_quantized_decimal(usage: Usage, price: Price) -> None:
    cost = cost_of(usage, price)
    if usage.input_tokens is None or usage.output_tokens is None:
        assert cost is None
        return
    assert isinstance(cost, Decimal) and cost >= 0
    assert cost == cost.quantize(COST_QUANTUM) and cost.as_tuple().exponent == -10


@PROPS
@given(
    inp=st.integers(0, 10**9),
    out=st.integers(0, 10**9),
    cached=st.integers(0, 10**9),
    price=prices,
    more_in=st.integers(0, 10**6),
    more_out=st.integers(0, 10**6),
)
def test_cost_is_monotone_in_input_and_output(
    inp: int, out: int, cached: int, price: Price, more_in: int, more_out: int
) -> None:
    cached = min(cached, inp)
    base = cost_of(Usage(inp, out, cached), price)
    bigger = cost_of(Usage(inp + more_in, out + more_out, cached), price)
    assert base is not None and bigger is not None and bigger >= base


@PROPS
@given(inp=st.integers(0, 10**9), out=st.integers(0, 10**9), cached=st.integers(0, 10**9), price=prices)
def test_cached_input_never_costs_more_than_uncached(inp: int, out: int, cached: int, price: Price) -> None:
    assume(price.cached_input is None or price.cached_input <= price.input)
    cached = min(cached, inp)
    with_cache = cost_of(Usage(inp, out, cached), price)
    without = cost_of(Usage(inp, out, 0), price)
    assert with_cache is not None and without is not None and with_cache <= without


@PROPS
@given(inp=st.integers(0, 10**12), out=st.integers(0, 10**12), cached=st.integers(0, 10**12), price=prices)
def test_cost_is_exact(inp: int, out: int, cached: int, price: Price) -> None:
    """Equal to the rational formula rounded half-even at 1e-10 (no float anywhere)."""
    cached = min(cached, inp)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    exact = (
        Fraction(inp - cached) * Fraction(price.input)
        + Fraction(cached) * Fraction(cached_rate)
        + Fraction(out) * Fraction(price.output)
    ) / 1_000_000
    scaled = exact * 10**10
    floor = scaled.numerator // scaled.denominator
    rest = scaled - floor
    rounded = floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)
    assert cost_of(Usage(inp, out, cached), price) == Decimal(rounded).scaleb(-10)


@PROPS
@given(usage=usages, price=prices, factor=st.integers(1, 5))
def test_higher_prices_never_cost_less(usage: Usage, price: Price, factor: int) -> None:
    dearer = Price(
        input=price.input * factor,
        output=price.output * factor,
        cached_input=None if price.cached_input is None else price.cached_input * factor,
        cache_write=None if price.cache_write is None else price.cache_write * factor,
    )
    a, b = cost_of(usage, price), cost_of(usage, dearer)
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert b >= a
