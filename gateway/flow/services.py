"""Everything a request needs, in one frozen bundle, and the one owner of background tasks.

gateway/bootstrap.py builds a ``Services`` from the settings and a policy; a hot reload
builds a new one (reusing the parts whose configuration did not change) and swaps it whole,
so a request that read ``services`` once sees one consistent policy, router, provider set and
cache from its first byte to its ledger row."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gateway.config.policy import Policy
from gateway.config.settings import Settings
from gateway.core.batch import BatchHolds
from gateway.core.ports import (
    ExactCache,
    Feedback,
    Ledger,
    Limits,
    Provider,
    ResponseStore,
    SemanticLookup,
    Stickiness,
    Tracer,
)
from gateway.core.ports_batch import BatchStore, BatchUpstream, FileStore
from gateway.limits.key_cache import KeyCache
from gateway.routing.breaker import BreakerBoard
from gateway.routing.engine_load import EngineBoard
from gateway.routing.learned_routes import LearnedRoutes
from gateway.routing.router import Router
from gateway.routing.shadow_spend import ShadowSpend
from gateway.routing.sticky import StickyConversations
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("switchyard")


class TaskOwner:
    """The one place background tasks are started. ``spawn``: work that should finish (a
    cache write, a reload); awaited at shutdown. ``daemon``: loops (the policy watcher, the
    engine probe); cancelled at shutdown. A task's failure is logged, never lost."""

    def __init__(self) -> None:
        self._work: set[asyncio.Task[Any]] = set()
        self._daemons: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._start(coro, self._work)

    def daemon(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._start(coro, self._daemons)

    def _start(self, coro: Coroutine[Any, Any, Any], into: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(partial(_finished, into))
        return task

    def __len__(self) -> int:
        return len(self._work) + len(self._daemons)

    async def aclose(self, grace: float = 5.0) -> None:
        """Cancel the daemons, give the work ``grace`` seconds, then cancel what is left."""
        for task in list(self._daemons):
            task.cancel()
        if self._work:
            await asyncio.wait(list(self._work), timeout=grace)
        for task in list(self._work):
            task.cancel()
        await asyncio.gather(*self._daemons, *self._work, return_exceptions=True)


def _finished(owner: set[asyncio.Task[Any]], task: asyncio.Task[Any]) -> None:
    owner.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_coro(), exc_info=task.exception())


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    policy: Policy
    router: Router
    providers: Mapping[str, Provider]
    cache: ExactCache
    semantic: SemanticLookup
    limits: Limits
    ledger: Ledger
    keys: KeyCache
    metrics: Metrics
    breakers: BreakerBoard
    engines: EngineBoard
    tasks: TaskOwner
    tracer: Tracer | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)  # provider keys, for redaction
    responses: ResponseStore | None = None  # stored Responses API responses (previous_response_id)
    sticky: Stickiness = field(default_factory=StickyConversations)  # shared through Redis if any
    batches: BatchStore | None = None  # the Batch API's state (in the ledger's database)
    files: FileStore | None = None  # the Files API's files
    batch_upstreams: Mapping[str, BatchUpstream] = field(default_factory=dict)  # providers' batch APIs
    batch_holds: BatchHolds = field(default_factory=BatchHolds)  # budgets held for batch items
    feedback: Feedback | None = None  # scores on served requests (POST /v1/feedback)
    learned: LearnedRoutes = field(default_factory=LearnedRoutes)  # the learned routes' state
    shadow_spend: ShadowSpend = field(default_factory=ShadowSpend)  # shadow evaluations' spend cap
