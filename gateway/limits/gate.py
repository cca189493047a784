"""The one object the pipeline asks about limits: rate limits at admission, budget
reservations before the upstream call, settlement after it.

Without Redis everything is in this process. With Redis (``RedisStore``) buckets and budget
counters are shared by every replica; when Redis fails the gate either falls back to its
in-process state (``fail_open``, the default; each fallback is counted through
``on_backend_error``) or refuses with 503.

With Redis a request costs one awaited round trip: ``admit`` given the body and the budget
candidates checks the rate limits and takes the worst-case reservation in one script (an
``Admission``; a budget refusal is kept for ``reserve`` to raise, so a cache hit is still
served), ``reserve`` hands that reservation out, and ``finish`` sends the tokens-per-minute
debit and the settlement together, in the background.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from gateway.config.policy import Policy, RoutePolicy
from gateway.core.carry import SharedRead, SharedWrite
from gateway.core.errors import ServiceUnavailableError
from gateway.core.ports import Spawn, TaskHandle
from gateway.core.types import Target
from gateway.limits.budget_report import BudgetReports
from gateway.limits.budgets import (
    BudgetLine,
    MemoryBook,
    Reservation,
    exceeded,
    to_nanos,
)
from gateway.limits.keys import KeyLimits
from gateway.limits.plans import Candidate, LimitPlans
from gateway.limits.ratelimit import BucketCheck, MemoryBuckets, refused
from gateway.limits.redis_store import RedisStore
from gateway.limits.worst_case import (
    EXACT_PROMPT_BYTES,
    output_multiplier,
    prompt_token_bound,
    requested_max_output,
)

log = logging.getLogger("switchyard")
KEY_LIMITS_TTL_S: Final = 5.0
NO_LIMITS: Final = KeyLimits()


@dataclass(slots=True)
class Admission:
    """What ``admit`` settled about the budgets of ``candidates`` (with Redis): the candidate
    reserved on and its reservation, or (``chosen`` None) the line that refused the first."""

    candidates: tuple[Candidate, ...]
    chosen: int | None
    reservation: Reservation | None
    refused: BudgetLine | None

    def matches(self, candidates: Sequence[Candidate]) -> bool:
        return len(candidates) == len(self.candidates) and all(
            a is b for a, b in zip(candidates, self.candidates, strict=True)
        )


def _held(reservation: Reservation | Admission | None) -> Reservation | None:
    return reservation.reservation if isinstance(reservation, Admission) else reservation


class Limits(BudgetReports):
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
            self.replace_key_limits(fresh)

    def confirm_key_limits(self) -> None:
        """The limits held are still the store's (a KeyWatch saw its counter unmoved): the
        periodic reload waits another ``KEY_LIMITS_TTL_S``."""
        self._key_limits_at = time.monotonic()

    def replace_key_limits(self, fresh: dict[str, KeyLimits]) -> None:
        """Every key's limits as the store has them now (read off the loop by a KeyWatch)."""
        self._key_limits_at = time.monotonic()
        if fresh != self._key_limits:
            self._key_limits = fresh
            self.plans.clear()

    def learn(self, key_id: str, limits: KeyLimits) -> None:
        """One key's limits as the store gave them with its record (a key made on another
        replica moments ago is never admitted here without its limits)."""
        if self._key_limits.get(key_id, NO_LIMITS) != limits:
            self._key_limits = {**self._key_limits, key_id: limits}
            self.plans.clear()

    def candidate(
        self, policy: Policy, route: str, kind: str, route_policy: RoutePolicy, targets: Sequence[Target]
    ) -> Candidate:
        """The (cached) budget candidate for a route plan."""
        return self.plans.candidate(policy, route, kind, route_policy, targets)

    # ------------------------------------------------------------------ rate limits
    @property
    def shared(self) -> bool:
        """Limits live in Redis: ``admit`` with the budget candidates saves a round trip."""
        return self.redis is not None

    async def admit(
        self,
        policy: Policy,
        tenant: str,
        key_id: str | None,
        *,
        body: Mapping[str, Any] | None = None,
        candidates: Sequence[Candidate] = (),
        peek: SharedRead | None = None,
    ) -> Admission | None:
        """Apply the tenant's and key's request/token rate limits; 429 with Retry-After.

        With Redis, a ``body`` and the budget ``candidates`` it will be reserved on, the
        worst-case reservation is taken in the same script: the ``Admission`` returned goes
        back to ``reserve`` (and to ``release``/``finish`` if the request ends before).
        ``peek``: another part's read on the same Redis, carried by the script when one runs
        (``peek.done`` says so; else its owner reads it)."""
        if key_id is not None and time.monotonic() - self._key_limits_at > KEY_LIMITS_TTL_S:
            self.refresh_key_limits()
        checks = self.plans.rates(policy, tenant, key_id)[0]
        budgeted = None
        if self.redis is not None and body is not None and candidates:
            budgeted = self._amounts(policy, tenant, key_id, body, candidates)
        if not checks and budgeted is None:
            return None
        refusal = None
        if self.redis is not None:
            try:
                if budgeted is None and peek is None:
                    refusal = await self.redis.apply(checks)
                else:
                    pairs = [(lines, amount) for _, lines, amount in budgeted or ()]
                    refusal, chosen, first = await self.redis.admit(checks, pairs, peek)
                    if refusal is None and budgeted is not None:
                        return self._admission(budgeted, chosen, first)
            except Exception as exc:
                self._backend_failed(exc)
                refusal = self.buckets.apply(checks)  # fail open: the budgets wait for reserve()
        else:
            refusal = self.buckets.apply(checks)
        if refusal is not None:
            raise refused(checks[refusal[0]], refusal[1])
        return None

    def _amounts(
        self,
        policy: Policy,
        tenant: str,
        key_id: str | None,
        body: Mapping[str, Any],
        candidates: Sequence[Candidate],
    ) -> list[tuple[Candidate, tuple[BudgetLine, ...], int]] | None:
        """(candidate, lines, worst case) up to the first candidate without budgets, as
        ``reserve`` would try them; None when the first has none (nothing to reserve)."""
        out: list[tuple[Candidate, tuple[BudgetLine, ...], int]] = []
        prompt: int | None = None
        for cand in candidates:
            lines = self.lines(policy, tenant, key_id, cand.route)
            if not lines:
                if not out:
                    return None
                out.append((cand, lines, 0))
                break
            if prompt is None:
                prompt = self._prompt_bound(body, cand.model)
            out.append((cand, lines, self._worst_case(body, cand, prompt)))
        return out

    def _admission(
        self,
        budgeted: list[tuple[Candidate, tuple[BudgetLine, ...], int]],
        chosen: int | None,
        first: int | None,
    ) -> Admission:
        cands = tuple(c for c, _, _ in budgeted)
        if chosen is None:
            assert first is not None
            return Admission(cands, None, None, budgeted[0][1][first])
        _, lines, amount = budgeted[chosen]
        return Admission(cands, chosen, Reservation(lines, amount, True) if lines else None, None)

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
        held: Reservation | Admission | None = None,
    ) -> tuple[int, Reservation | None]:
        """Reserve the worst case on the first candidate whose budgets allow it. Returns (index
        of the candidate, reservation or None when no budget applies); raises 429
        ``budget_exceeded`` naming the first budget that refused when none allows it.
        ``held``: what ``admit`` returned; when it was taken for these candidates, its
        outcome is the answer (no second round trip)."""
        if isinstance(held, Admission):
            if held.matches(candidates):
                if held.chosen is None:
                    assert held.refused is not None
                    raise exceeded(held.refused, time.time())
                return held.chosen, held.reservation
            self.release(held)  # taken for another plan: give it back, reserve afresh
        first_refusal: BudgetLine | None = None
        prompt: int | None = None
        for index, cand in enumerate(candidates):
            lines = self.lines(policy, tenant, key_id, cand.route)
            if not lines:
                return index, None
            if prompt is None:
                prompt = self._prompt_bound(body, cand.model)
            amount = self._worst_case(body, cand, prompt)
            refusal, remote = await self._reserve(lines, amount)
            if refusal is None:
                return index, Reservation(lines, amount, remote)
            first_refusal = first_refusal or lines[refusal]
        assert first_refusal is not None
        raise exceeded(first_refusal, time.time())

    def _prompt_bound(self, body: Mapping[str, Any], model: str) -> int:
        prompt = prompt_token_bound(body)  # an upper bound, cheap at any size
        if prompt <= EXACT_PROMPT_BYTES:  # small enough to tokenize on the loop
            prompt = self._prompt_tokens(body, model)
        return prompt

    @staticmethod
    def _worst_case(body: Mapping[str, Any], cand: Candidate, prompt: int) -> int:
        max_out = (requested_max_output(body) or cand.max_output_tokens) * output_multiplier(body)
        return cand.worst_case(prompt, max_out)

    async def _reserve(self, lines: Sequence[BudgetLine], amount: int) -> tuple[int | None, bool]:
        if self.redis is not None:
            try:
                return await self.redis.reserve(lines, amount), True
            except Exception as exc:
                self._backend_failed(exc)
        return self.book.reserve(lines, amount), False

    def settle(self, reservation: Reservation | Admission | None, cost: Decimal | None) -> None:
        """Replace the reservation by the real cost (None: unknown, the reservation stays)."""
        reservation = _held(reservation)
        if reservation is None or not reservation.open:
            return
        reservation.open = False
        if cost is None:
            return
        self._adjust(reservation, to_nanos(cost) - reservation.amount)

    def release(self, reservation: Reservation | Admission | None) -> None:
        """Give the whole reservation back (the call failed: nothing was spent)."""
        reservation = _held(reservation)
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

    def finish(
        self,
        policy: Policy,
        key_id: str | None,
        tokens: int,
        reservation: Reservation | Admission | None,
        cost: Decimal | None,
        put: SharedWrite | None = None,
    ) -> bool:
        """A served request: charge ``tokens`` to the key's tokens-per-minute bucket and settle
        the reservation to ``cost`` (as ``record_tokens`` + ``settle``); with Redis both go
        in one script, in the background. ``put``: another part's write on the same Redis,
        carried by that script when one runs; returns whether it was (else its owner writes)."""
        debits: tuple[BucketCheck, ...] = ()
        if key_id is not None and tokens > 0:
            tpm = self.plans.rates(policy, "", key_id)[1]
            if tpm is not None:
                debits = (BucketCheck(tpm[0], tpm[1], float(tokens), "debit", tpm[2]),)
        res = _held(reservation)
        lines: tuple[BudgetLine, ...] = ()
        delta = 0
        if res is not None and res.open:
            res.open = False
            if cost is not None:
                lines, delta = res.lines, to_nanos(cost) - res.amount
        if self.redis is None:
            if debits:
                self.buckets.apply(debits)
            if delta:
                self.book.adjust(lines, delta)
            return False
        if delta and res is not None and not res.remote:  # held in process (a fallback)
            self.book.adjust(lines, delta)
            lines, delta = (), 0
        if not (debits or delta):
            return False
        carried = self.redis.carries(put)
        self._spawn(self._remote_finish(debits, lines, delta, put if carried else None))
        return carried

    async def _remote_finish(
        self, debits: Sequence[BucketCheck], lines: Sequence[BudgetLine], delta: int, put: SharedWrite | None
    ) -> None:
        assert self.redis is not None
        try:
            await self.redis.finish(debits, lines, delta, put)
        except Exception as exc:
            self._backend_failed(exc, background=True)
            if debits:
                self.buckets.apply(debits)

    async def _remote_adjust(self, lines: Sequence[BudgetLine], delta: int) -> None:
        assert self.redis is not None
        try:
            await self.redis.adjust(lines, delta)
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
