"""flow.metering.priced: the memoised pricing gives exactly ledger.pricing.cost_of's answer,
for every usage shape, and a new price object (a policy reload) is priced afresh."""

from __future__ import annotations

from decimal import Decimal

from gateway.core.types import Price, Usage
from gateway.flow import metering
from gateway.ledger.pricing import cost_of

USAGES = [
    Usage(12, 16),
    Usage(12, 16),  # the memo's answer
    Usage(1000, 0, cached_input_tokens=600),
    Usage(1000, 5, cached_input_tokens=100, cache_write_tokens=300, cache_write_1h_tokens=100),
    Usage(None, 3),
    Usage(7, None),
]


def test_priced_matches_cost_of_for_every_usage() -> None:
    price = Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"), Decimal("0.1875"))
    for usage in USAGES:
        for expected in (True, False):
            assert metering.priced(usage, price, expected) == cost_of(usage, price, output_expected=expected)


def test_a_new_price_object_is_priced_afresh() -> None:
    usage = Usage(1_000_000, 1_000_000)
    for rate in ("1", "2", "3"):
        price = Price(Decimal(rate), Decimal(rate))  # each replaces the last (its id may be reused)
        assert metering.priced(usage, price, True) == Decimal(rate) * 2
