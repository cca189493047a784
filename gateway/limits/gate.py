"""The one object the pipeline asks about limits: rate limits at admission, budget
reservations before the upstream call, settlement after it.

Without Redis everything is in this process. With Redis (``RedisStore``) buckets and budget
counters are shared by every replica; when Redis fails the gate either falls back to its
in-process state (``fail_open``, the default; each fallback is counted through
``on_backend_error``) or refuses with 503.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

import orjson

from gateway.config.policy import BudgetPolicy, Policy, RoutePolicy
from gateway.core.errors import ServiceUnavailableError
from gateway.core.ports import Spawn, TaskHandle
from gateway.core.types import Target
from gateway.limits.budgets import (
    BudgetLine,
    MemoryBook,
    Period,
    Reservation,
    Scope,
    budget_lines,
    exceeded,
    from_nanos,
    period_bounds,
    to_nanos,
)
from gateway.limits.keys import KeyLimits
from gateway.limits.plans import Candidate, LimitPlans
from gateway.limits.ratelimit import BucketCheck, MemoryBuckets, refused
from gateway.limits.redis_store import RedisStore

log = logging.getLogger("switchyard")
KEY_LIMITS_TTL_S: Final = 5.0
# Prompts larger than this (JSON bytes) reserve their byte bound instead of a tokenizer count:
# tokenizing megabytes on the event loop would stall every other request.
EXACT_PROMPT_BYTES: Final = 64 * 1024
NO_LIMITS: Final = KeyLimits()


def prompt_token_bound(body: Mapping[str, Any], model: str = "") -> int:
    """A cheap upper bound of the prompt's tokens: the bytes of its JSON (a BPE token covers at
    least one byte, and the JSON framing outweighs the per-message token overhead)."""
    return len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("input") or ""))


def requested_max_output(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def output_multiplier(body: Mapping[str, Any]) -> int:
    """How many answers of up to max_tokens one request may be billed for: ``n`` choices (or
    ``best_of`` candidates, the larger), for each prompt of a batched /v1/completions call."""
    answers = max(_count(body.get("n")), _count(body.get("best_of")))
    prompt = body.get("prompt")
    prompts = 1
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompts = len(prompt)  # a list of strings or of token lists: one answer set each
    return answers * prompts


class Limits:
    def __init__(
        self,
        redis: RedisStore | None = None,
        *,
        fail_open: bool = True,
        key_limits: Callable[[], dict[str, KeyLimits]] | None = None,
        on_backend_error: Callable[[str], None] | None = None,
        prompt_tokens: Callable[[Mapping[str, Any], str], int] = prompt_token_bound,
        spawn: Spawn,
    ) -> None:
        self._prompt_tokens = prompt_tokens
        self.redis = redis
        self.fail_open = fail_open
        self.buckets = MemoryBuckets()
        self.book = MemoryBook()
        self._load_key_limits = key_limits
        self._key_limits: dict[str, KeyLimits] = {}
        self._key_limits_at = -math.inf
        self._on_error = on_backend_error
        self._spawn_task = spawn  # Redis debits run in the background
        self._tasks: set[TaskHandle] = set()
        self.plans = LimitPlans(self.key_limits)

    # ------------------------------------------------------------------ keys
    def key_limits(self, key_id: str | None) -> KeyLimits:
        if key_id is None or self._load_key_limits is None:
            return NO_LIMITS
        now = time.monotonic()
        if now - self._key_limits_at > KEY_LIMITS_TTL_S:
            self.refresh_key_limits()
        return self._key_limits.get(key_id, NO_LIMITS)

    def refresh_key_limits(self) -> None:
        if self._load_key_limits is not None:
            try:
                fresh = self._load_key_limits()
            except Exception:
                log.exception("could not read key limits; keeping the previous ones")
                fresh = self._key_limits
            self._key_limits_at = time.monotonic()
            if fresh != self._key_limits:
                self._key_limits = fresh
                self.plans.clear()

    def candidate(
        self, policy: Policy, route: str, kind: str, route_policy: RoutePolicy, targets: Sequence[Target]
    ) -> Candidate:
        """The (cached) budget candidate for a route plan."""
        return self.plans.candidate(policy, route, kind, route_policy, targets)

    # ------------------------------------------------------------------ rate limits
    async def admit(self, policy: Policy, tenant: str, key_id: str | None) -> None:
        """Apply the tenant's and key's request/token rate limits; 429 with Retry-After."""
        if key_id is not None and time.monotonic() - self._key_limits_at > KEY_LIMITS_TTL_S:
            self.refresh_key_limits()
        checks = self.plans.rates(policy, tenant, key_id)[0]
        if not checks:
            return
        refusal = None
        local = True
        if self.redis is not None:
            try:
                refusal = await self.redis.apply(checks)
                local = False
            except Exception as exc:
                self._backend_failed(exc)
        if local:
            refusal = self.buckets.apply(checks)
        if refusal is not None:
            raise refused(checks[refusal[0]], refusal[1])

    def record_tokens(self, policy: Policy, key_id: str | None, tokens: int) -> None:
        """Charge the tokens a request used to its key's tokens-per-minute bucket."""
        if key_id is None or tokens <= 0:
            return
        tpm = self.plans.rates(policy, "", key_id)[1]
        if tpm is None:
            return
        checks = (BucketCheck(tpm[0], tpm[1], float(tokens), "debit", tpm[2]),)
        if self.redis is not None:
            self._spawn(self._remote_debit(checks))
        else:
            self.buckets.apply(checks)

    async def _remote_debit(self, checks: Sequence[BucketCheck]) -> None:
        assert self.redis is not None
        try:
            await self.redis.apply(checks)
        except Exception as exc:
            self._backend_failed(exc, background=True)
            self.buckets.apply(checks)

    # ------------------------------------------------------------------ budgets
    def lines(self, policy: Policy, tenant: str, key_id: str | None, route: str) -> tuple[BudgetLine, ...]:
        return self.plans.lines(policy, tenant, key_id, route)

    async def reserve(
        self,
        policy: Policy,
        tenant: str,
        key_id: str | None,
        body: Mapping[str, Any],
        candidates: Sequence[Candidate],
    ) -> tuple[int, Reservation | None]:
        """Reserve the worst case on the first candidate whose budgets allow it. Returns (index
        of the candidate, reservation or None when no budget applies); raises 429
        ``budget_exceeded`` naming the first budget that refused when none allows it."""
        first_refusal: BudgetLine | None = None
        prompt: int | None = None
        for index, cand in enumerate(candidates):
            lines = self.lines(policy, tenant, key_id, cand.route)
            if not lines:
                return index, None
            if prompt is None:
                prompt = prompt_token_bound(body)  # an upper bound, cheap at any size
                if prompt <= EXACT_PROMPT_BYTES:  # small enough to tokenize on the loop
                    prompt = self._prompt_tokens(body, cand.model)
            max_out = (requested_max_output(body) or cand.max_output_tokens) * output_multiplier(body)
            amount = cand.worst_case(prompt, max_out)
            refusal, remote = await self._reserve(lines, amount)
            if refusal is None:
                return index, Reservation(lines, amount, remote)
            first_refusal = first_refusal or lines[refusal]
        assert first_refusal is not None
        raise exceeded(first_refusal, time.time())

    async def _reserve(self, lines: Sequence[BudgetLine], amount: int) -> tuple[int | None, bool]:
        if self.redis is not None:
            try:
                return await self.redis.reserve(lines, amount), True
            except Exception as exc:
                self._backend_failed(exc)
        return self.book.reserve(lines, amount), False

    def settle(self, reservation: Reservation | None, cost: Decimal | None) -> None:
        """Replace the reservation by the real cost (None: unknown, the reservation stays)."""
        if reservation is None or not reservation.open:
            return
        reservation.open = False
        if cost is None:
            return
        self._adjust(reservation, to_nanos(cost) - reservation.amount)

    def release(self, reservation: Reservation | None) -> None:
        """Give the whole reservation back (the call failed: nothing was spent)."""
        if reservation is None or not reservation.open:
            return
        reservation.open = False
        self._adjust(reservation, -reservation.amount)

    def _adjust(self, reservation: Reservation, delta: int) -> None:
        if delta == 0:
            return
        if reservation.remote and self.redis is not None:
            self._spawn(self._remote_adjust(reservation.lines, delta))
        else:
            self.book.adjust(reservation.lines, delta)

    async def _remote_adjust(self, lines: Sequence[BudgetLine], delta: int) -> None:
        assert self.redis is not None
        try:
            await self.redis.adjust(lines, delta)
        except Exception as exc:
            self._backend_failed(exc, background=True)

    # ------------------------------------------------------------------ reporting, seeding
    def configured(self, policy: Policy) -> list[tuple[Scope, str, BudgetPolicy]]:
        """Every budget the policy and the key store define (bounded: names come from config)."""
        out: list[tuple[Scope, str, BudgetPolicy]] = []
        for key_id, kl in self._key_limits.items():
            if kl.daily_usd is not None or kl.monthly_usd is not None:
                out.append(("key", key_id, BudgetPolicy(daily_usd=kl.daily_usd, monthly_usd=kl.monthly_usd)))
        out += [("tenant", n, t.budget) for n, t in policy.tenants.items() if t.budget != BudgetPolicy()]
        out += [("route", n, r.budget) for n, r in policy.routes.items() if r.budget != BudgetPolicy()]
        return out

    def _all_lines(self, policy: Policy) -> list[BudgetLine]:
        self.key_limits("")  # refresh when stale
        now = time.time()
        lines: list[BudgetLine] = []
        for scope, name, budget in self.configured(policy):
            key_id = name if scope == "key" else None
            tenant = name if scope == "tenant" else ""
            route = name if scope == "route" else ""
            kb = budget if scope == "key" else None
            lines += [ln for ln in budget_lines(policy, tenant, key_id, kb, route, now) if ln.scope == scope]
        return lines

    async def status(self, policy: Policy) -> list[dict[str, Any]]:
        """Limit, spent (incl. reserved) and remaining USD of every configured budget."""
        lines = self._all_lines(policy)
        spent = [self.book.spent(ln) for ln in lines]
        if self.redis is not None and lines:
            try:
                spent = await self.redis.spent(lines)
            except Exception as exc:
                self._backend_failed(exc, background=True)
        return [
            {
                "scope": ln.scope,
                "name": ln.name,
                "period": ln.period,
                "period_id": ln.period_id,
                "limit_usd": from_nanos(ln.limit),
                "spent_usd": from_nanos(s),
                "remaining_usd": from_nanos(max(0, ln.limit - s)),
                "resets_at": ln.ends_at,
            }
            for ln, s in zip(lines, spent, strict=True)
        ]

    async def seed(
        self, policy: Policy, spent_since: Callable[[Scope, float], Mapping[str, Decimal]]
    ) -> None:
        """Start every configured budget at what the ledger says its period already spent."""
        now = time.time()
        cache: dict[tuple[Scope, Period], Mapping[str, Decimal]] = {}
        for line in self._all_lines(policy):
            k = (line.scope, line.period)
            if k not in cache:
                start = period_bounds(line.period, now)[1]
                cache[k] = await asyncio.to_thread(spent_since, line.scope, start)
            nanos = to_nanos(cache[k].get(line.name, Decimal(0)))
            if nanos <= 0:
                continue
            self.book.seed(line, nanos)
            if self.redis is not None:
                try:
                    await self.redis.seed(line, nanos)
                except Exception as exc:
                    self._backend_failed(exc, background=True)

    # ------------------------------------------------------------------ plumbing
    def _backend_failed(self, exc: Exception, *, background: bool = False) -> None:
        action = "fail_open" if self.fail_open or background else "fail_closed"
        if self._on_error is not None:
            self._on_error(action)
        log.warning("limits backend (redis) failed (%s): %s", action, type(exc).__name__)
        if action == "fail_closed":
            raise ServiceUnavailableError(
                "The rate-limit/budget store is unavailable", code="limits_unavailable"
            ) from None

    def _spawn(self, coro: Any) -> None:
        self._tasks = {t for t in self._tasks if not t.done()}
        self._tasks.add(self._spawn_task(coro))

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.redis is not None:
            await self.redis.aclose()
