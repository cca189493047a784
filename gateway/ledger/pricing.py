"""Exact USD pricing of one request's token usage.

Prices are USD per 1M tokens (``core.Price``). ``Usage.input_tokens`` already includes cached
reads and cache writes (OpenAI's ``prompt_tokens`` convention), so those are carved out of the
input count and priced at their own rates. Reasoning tokens are part of ``output_tokens``
(OpenAI's ``completion_tokens`` convention) and are therefore priced as output, never added a
second time.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, localcontext

from gateway.core.types import Price, Usage

COST_QUANTUM = Decimal("1E-10")
"""Every cost leaves this module quantized to 1e-10 USD (ROUND_HALF_EVEN)."""

_PER = Decimal(1_000_000)
_PRECISION = 60  # plenty for any token count x any price; independent of the caller's context


def quantize_usd(value: Decimal) -> Decimal:
    """Round ``value`` to the ledger's money quantum (1e-10 USD, banker's rounding)."""
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        return value.quantize(COST_QUANTUM, rounding=ROUND_HALF_EVEN)


def cost_of(usage: Usage, price: Price, *, output_expected: bool = True) -> Decimal | None:
    """The USD cost of ``usage`` at ``price``, exact and quantized to 1e-10 USD.

    cost = ( max(0, input - cached - cache_write) x price.input
           + cached            x (price.cached_input   or price.input)
           + (cache_write - 1h) x (price.cache_write    or price.input)
           + 1h                x (price.cache_write_1h or price.cache_write or price.input)
           + output            x price.output ) / 1,000,000

    where ``1h`` = ``cache_write_1h_tokens`` (capped at ``cache_write_tokens``): Anthropic's
    1-hour cache writes (2x input) inside its total cache writes (5-minute ones: 1.25x).

    - Returns None when the cost is unknown: ``input_tokens`` is None, or ``output_tokens`` is
      None while output is expected. Pass ``output_expected=False`` for endpoints that produce
      no tokens (embeddings); then a missing ``output_tokens`` counts as 0.
    - A missing ``cached_input_tokens`` / ``cache_write_tokens`` means "none reported" and
      counts as 0 (the tokens are then priced as plain input, the conservative choice).
    - Never negative: the plain (non-cached) input part is clamped at 0 when an upstream
      reports more cached + cache-write tokens than input tokens, and negative counts are
      treated as 0. The cached and cache-write parts are still charged as reported.
    - Reasoning tokens are already inside ``output_tokens`` and are priced as output.
    """
    if usage.input_tokens is None:
        return None
    if usage.output_tokens is None and output_expected:
        return None
    total_in = max(0, usage.input_tokens)
    cached = max(0, usage.cached_input_tokens or 0)
    written = max(0, usage.cache_write_tokens or 0)
    written_1h = min(written, max(0, usage.cache_write_1h_tokens or 0))
    output = max(0, usage.output_tokens or 0)
    plain = max(0, total_in - cached - written)
    cached_rate = price.input if price.cached_input is None else price.cached_input
    write_rate = price.input if price.cache_write is None else price.cache_write
    write_1h_rate = write_rate if price.cache_write_1h is None else price.cache_write_1h
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        micro = (
            plain * price.input
            + cached * cached_rate
            + (written - written_1h) * write_rate
            + written_1h * write_1h_rate
            + output * price.output
        )
        return (micro / _PER).quantize(COST_QUANTUM, rounding=ROUND_HALF_EVEN)
