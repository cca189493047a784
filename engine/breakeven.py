"""Monthly cost of self-hosting versus an API at a daily token volume, computed from a profile's
GPU price and measured (or given) throughput, not assumed.

Self-hosted: replicas = max(1, ceil(GPU-seconds needed per day / (86,400 x utilization))), each
replica billed around the clock (730 hours a month). API: tokens x list price."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

HOURS_PER_MONTH = Decimal(730)
DAYS_PER_MONTH = Decimal("30.4167")
MILLION = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class ApiPrice:
    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Row:
    tokens_per_day: int
    api_usd_per_month: Decimal
    self_hosted_usd_per_month: Decimal
    replicas: int
    utilization: float  # of the replicas' capacity actually used
    cheaper: str  # "api" | "self-hosted"


def api_monthly(tokens_per_day: int, output_share: float, cached_share: float, price: ApiPrice) -> Decimal:
    return _api_monthly(tokens_per_day, output_share, cached_share, price).quantize(Decimal("0.01"))


def _api_monthly(tokens_per_day: int, output_share: float, cached_share: float, price: ApiPrice) -> Decimal:
    out = Decimal(tokens_per_day) * Decimal(repr(output_share))
    inp = Decimal(tokens_per_day) - out
    cached = inp * Decimal(repr(cached_share))
    fresh = inp - cached
    cached_price = price.cached_input if price.cached_input is not None else price.input
    daily = (fresh * price.input + cached * cached_price + out * price.output) / MILLION
    return daily * DAYS_PER_MONTH


def gpu_seconds_per_day(tokens_per_day: int, output_share: float, prompt_tps: float, gen_tps: float) -> float:
    out = tokens_per_day * output_share
    return (tokens_per_day - out) / prompt_tps + out / gen_tps


def table(
    volumes: list[int],
    *,
    usd_per_hour: Decimal,
    prompt_tps: float,
    gen_tps: float,
    api: ApiPrice,
    output_share: float = 0.25,
    cached_share: float = 0.0,
    max_utilization: float = 0.6,
) -> list[Row]:
    """One row per daily volume. ``max_utilization``: the busy fraction a replica is planned at
    (traffic is bursty); ``cached_share`` of input tokens are API cache reads."""
    rows = []
    for v in volumes:
        need = gpu_seconds_per_day(v, output_share, prompt_tps, gen_tps)
        replicas = max(1, math.ceil(need / (86_400 * max_utilization)))
        self_hosted = (usd_per_hour * HOURS_PER_MONTH * replicas).quantize(Decimal("0.01"))
        api_cost = api_monthly(v, output_share, cached_share, api)
        rows.append(
            Row(
                tokens_per_day=v,
                api_usd_per_month=api_cost,
                self_hosted_usd_per_month=self_hosted,
                replicas=replicas,
                utilization=need / (86_400 * replicas),
                cheaper="api" if api_cost < self_hosted else "self-hosted",
            )
        )
    return rows


def breakeven_tokens_per_day(
    *, usd_per_hour: Decimal, api: ApiPrice, output_share: float, cached_share: float = 0.0
) -> int:
    """The daily volume at which one always-on replica costs what the API does."""
    per_token_month = _api_monthly(1_000_000, output_share, cached_share, api) / MILLION
    if per_token_month <= 0:
        raise ValueError("the API price is zero: self-hosting never breaks even")
    return int((usd_per_hour * HOURS_PER_MONTH / per_token_month).to_integral_value())


def render(rows: list[Row], breakeven: int, capacity_per_replica: int) -> str:
    lines = [
        "| tokens/day | API $/month | self-hosted $/month | replicas | GPU busy | cheaper |",
        "| ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.tokens_per_day:,} | {r.api_usd_per_month:,.2f} | {r.self_hosted_usd_per_month:,.2f} "
            f"| {r.replicas} | {r.utilization:.1%} | {r.cheaper} |"
        )
    lines.append("")
    lines.append(f"break-even: {breakeven:,} tokens/day (one always-on replica)")
    lines.append(f"one replica serves up to {capacity_per_replica:,} tokens/day at the planned utilization")
    return "\n".join(lines)


def parse_volume(text: str) -> int:
    """'1e6', '10M', '500k', '2B', '1000000' -> tokens."""
    t = text.strip().lower().replace(",", "").replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    value = float(t) * mult
    if value <= 0 or not math.isfinite(value):
        raise ValueError(f"not a positive volume: {text!r}")
    return int(value)
