"""What limits apply to a (tenant, key, route), computed once and reused.

Building bucket checks and budget lines costs tens of microseconds (strings, dates,
Decimals); a request only looks them up. Entries are dropped when the policy object changes
(a hot reload), when key limits are reloaded (``clear``), and budget lines when their period
ends. The caches are bounded."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Final

from gateway.config.policy import BudgetPolicy, Policy, RoutePolicy
from gateway.core.types import Price, Target
from gateway.limits.budgets import BudgetLine, budget_lines, dearest_rates
from gateway.limits.keys import KeyLimits
from gateway.limits.ratelimit import BucketCheck

MAX_ENTRIES: Final = 50_000
Tpm = tuple[str, int, str]  # bucket key, tokens per minute, words for the error


class Candidate:
    """A route a request may be served on: its targets' prices and the output tokens reserved
    when the client sets no max_tokens; ``in_rate``/``out_rate`` are the dearest USD per 1M."""

    __slots__ = ("in_rate", "max_output_tokens", "model", "out_rate", "prices", "route")

    def __init__(
        self, route: str, prices: tuple[Price, ...], max_output_tokens: int, model: str = ""
    ) -> None:
        self.route = route
        self.prices = prices
        self.max_output_tokens = max_output_tokens
        self.model = model  # whose tokenizer counts the prompt (the first target's upstream id)
        self.in_rate, self.out_rate = dearest_rates(prices)

    def worst_case(self, prompt_tokens: int, max_output_tokens: int) -> int:
        """Nanos: every prompt token at the dearest input rate, every output token at the
        dearest output rate (same as ``budgets.worst_case_nanos``)."""
        micro = max(0, prompt_tokens) * self.in_rate + max(0, max_output_tokens) * self.out_rate
        return math.ceil(micro * 1000)


def make_candidate(
    policy: Policy, route: str, kind: str, route_policy: RoutePolicy, targets: Sequence[Target]
) -> Candidate:
    """Output reserved: the route's max_output_tokens, else the largest of its models' (when
    every model sets one), else the policy default (0 for embeddings)."""
    max_out = route_policy.max_output_tokens
    if max_out is None:
        per_model = [policy.models[t.model].max_output_tokens for t in targets if t.model in policy.models]
        known = [m for m in per_model if m is not None]
        if known and len(known) == len(targets):
            max_out = max(known)
        else:
            max_out = 0 if kind == "embeddings" else policy.limits.default_max_output_tokens
    model = targets[0].upstream_model if targets else ""
    return Candidate(route, tuple(t.price for t in targets), max_out, model)


class LimitPlans:
    def __init__(self, key_limits: Callable[[str | None], KeyLimits]) -> None:
        self._key_limits = key_limits
        self._policy: Policy | None = None
        self._rates: dict[tuple[str, str | None], tuple[tuple[BucketCheck, ...], Tpm | None]] = {}
        self._lines: dict[tuple[str, str | None, str], tuple[float, tuple[BudgetLine, ...]]] = {}
        self._cands: dict[tuple[str, str], tuple[RoutePolicy, Sequence[Target], Candidate]] = {}

    def clear(self) -> None:
        self._rates.clear()
        self._lines.clear()
        self._cands.clear()

    def _check_policy(self, policy: Policy) -> None:
        if policy is not self._policy:
            self.clear()
            self._policy = policy

    def rates(
        self, policy: Policy, tenant: str, key_id: str | None
    ) -> tuple[tuple[BucketCheck, ...], Tpm | None]:
        """(admission checks: tenant rpm, key rpm, key tpm > 0; the key's tpm bucket or None)."""
        self._check_policy(policy)
        hit = self._rates.get((tenant, key_id))
        if hit is None:
            hit = self._rates_for(policy, tenant, key_id)
            if len(self._rates) >= MAX_ENTRIES:
                self._rates.clear()
            self._rates[(tenant, key_id)] = hit
        return hit

    def _rates_for(
        self, policy: Policy, tenant: str, key_id: str | None
    ) -> tuple[tuple[BucketCheck, ...], Tpm | None]:
        checks: list[BucketCheck] = []
        tp = policy.tenants.get(tenant)
        if tp is not None and tp.rpm is not None:
            what = f"{tp.rpm} requests per minute for tenant '{tenant}'"
            checks.append(BucketCheck(f"rpm:tenant:{tenant}", tp.rpm, 1.0, "take", what))
        tpm: Tpm | None = None
        if key_id is not None:
            kl = self._key_limits(key_id)
            rpm = kl.rpm or policy.limits.key_rpm
            tpm_limit = kl.tpm or policy.limits.key_tpm
            if rpm is not None:
                what = f"{rpm} requests per minute for key '{key_id}'"
                checks.append(BucketCheck(f"rpm:key:{key_id}", rpm, 1.0, "take", what))
            if tpm_limit is not None:
                tpm = (f"tpm:key:{key_id}", tpm_limit, f"{tpm_limit} tokens per minute for key '{key_id}'")
                checks.append(BucketCheck(tpm[0], tpm_limit, 0.0, "check", tpm[2]))
        return tuple(checks), tpm

    def lines(self, policy: Policy, tenant: str, key_id: str | None, route: str) -> tuple[BudgetLine, ...]:
        """Every budget line that applies, for the current day and month."""
        self._check_policy(policy)
        now = time.time()
        hit = self._lines.get((tenant, key_id, route))
        if hit is not None and hit[0] > now:
            return hit[1]
        kl = self._key_limits(key_id)
        key_budget = None
        if kl.daily_usd is not None or kl.monthly_usd is not None:
            key_budget = BudgetPolicy(daily_usd=kl.daily_usd, monthly_usd=kl.monthly_usd)
        lines = tuple(budget_lines(policy, tenant, key_id, key_budget, route, now))
        expires = min((ln.ends_at for ln in lines), default=now + 3600.0)
        if len(self._lines) >= MAX_ENTRIES:
            self._lines.clear()
        self._lines[(tenant, key_id, route)] = (expires, lines)
        return lines

    def candidate(
        self, policy: Policy, route: str, kind: str, route_policy: RoutePolicy, targets: Sequence[Target]
    ) -> Candidate:
        self._check_policy(policy)
        hit = self._cands.get((route, kind))
        if hit is not None and hit[0] is route_policy and hit[1] is targets:
            return hit[2]
        cand = make_candidate(policy, route, kind, route_policy, targets)
        if len(self._cands) >= MAX_ENTRIES:
            self._cands.clear()
        self._cands[(route, kind)] = (route_policy, targets, cand)
        return cand
