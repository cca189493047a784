"""The Batch API's runner: one loop per gateway process that moves the open batches on.

Each turn it hands the ledger the rows of finished items it may not have yet (after a crash),
then for every open batch: ends what a cancel or an expired ``completion_window`` left
unrun, claims items up to what the batch's lane allows now and runs each
(gateway/flow/batch_items.py), and finalises a batch with nothing left to run (OpenAI: its
output and error files).

Lanes (the route's ``batch`` policy): ``low_priority`` runs at most ``concurrency`` items at a
time and none while ``yield_above`` interactive requests are in flight; ``self_hosted`` also
waits until every self-hosted engine of the route shows spare capacity (its queue and KV
cache use, as gateway/routing/engine_load.py reads them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.config.policy import RouteBatchPolicy
from gateway.core.batch import Batch, Claimed
from gateway.core.errors import SwitchyardError
from gateway.core.ports import BatchStore
from gateway.core.types import Principal
from gateway.flow import batch_budget, batch_forward, batch_items
from gateway.flow.services import Services
from gateway.protocols import batches as wire
from gateway.routing.plan import RoutePlan

log = logging.getLogger("switchyard")
BILL_CHUNK = 500


class BatchRunner:
    def __init__(self, services: Callable[[], Services]) -> None:
        self.services = services
        self.interactive: Callable[[], int] = lambda: 0  # requests in flight (set by the API layer)
        self._running: dict[tuple[str, int], Claimed] = {}
        self._per_batch: dict[str, int] = {}
        self._billed: list[tuple[str, int]] = []  # in the ledger: marked billed next turn, together
        self._recovered = False
        self._polled: dict[str, float] = {}  # lane provider: when each batch's upstream was last read

    async def run(self) -> None:
        """Until cancelled (an item cut by the shutdown gives its claim back itself)."""
        while True:
            svc = self.services()
            if svc.batches is not None:
                try:
                    await self.turn(svc, svc.batches)
                except Exception:  # a turn must never stop the loop (a database blip)
                    log.exception("batch runner turn failed")
            await asyncio.sleep(svc.policy.batches.poll_interval_s)

    async def turn(self, svc: Services, store: BatchStore) -> None:
        if not self._recovered:  # once per process: rows a crash left between item and ledger
            await bill(svc, store)
            self._recovered = True
        billed, self._billed = self._billed, []
        if billed:
            await store.mark_billed(billed)
        now = time.time()
        for batch in await store.open_batches():
            if batch.status == "in_progress" and now >= batch.expires_at:
                await store.close_pending(batch.id, "expired", wire.closed("expired"))
                batch.times["expired_at"] = now
                batch_budget.release(svc, svc.batch_holds.take_all(batch.id))
            elif batch.status == "cancelling":
                await store.close_pending(batch.id, "canceled", wire.closed("canceled"))
                batch_budget.release(svc, svc.batch_holds.take_all(batch.id))
            route = self.route(svc, batch)
            if batch.upstream is not None and route is not None:  # lane provider: follow it
                if now - self._polled.get(batch.id, 0.0) >= svc.policy.batches.upstream_poll_s:
                    self._polled[batch.id] = now
                    self._billed += await batch_forward.poll(svc, store, batch, route[0])
            elif batch.status == "in_progress" and "expired_at" not in batch.times:
                forward = (
                    batch_forward.upstream_of(svc, route[0], batch.endpoint)
                    if route and route[1].lane == "provider"
                    else None
                )
                if route is not None and forward is not None:
                    await batch_forward.submit(svc, store, batch, route[0], *forward)
                    continue
                await self._start(svc, store, batch)
                if self._per_batch.get(batch.id):
                    continue
            if not self._per_batch.get(batch.id) and not await store.unfinished(batch.id):
                await finalise(svc, store, batch)
                self._polled.pop(batch.id, None)

    @staticmethod
    def route(svc: Services, batch: Batch) -> tuple[RoutePlan, RouteBatchPolicy] | None:
        """The plan of the batch's model and its route's batch policy (None: it names no route
        the batch's tenant may use; its items fail as their requests would)."""
        kind = "embeddings" if batch.endpoint == "/v1/embeddings" else "chat"
        who = Principal(batch.tenant, batch.key_id, svc.policy.allowed_models(batch.tenant))
        try:
            plan = svc.router.plan(batch.model or "", who, kind)
        except SwitchyardError:
            return None
        return plan, plan.policy.batch

    def slots(self, svc: Services, batch: Batch) -> int:
        """How many more items of ``batch`` may start now, by its route's lane (``provider``
        without a batch API to send to runs as ``low_priority``)."""
        route = self.route(svc, batch)
        if route is None:
            return 4 - self._per_batch.get(batch.id, 0)
        plan, policy = route
        if policy.yield_above is not None and self.interactive() >= policy.yield_above:
            return 0
        if policy.lane == "self_hosted" and not engines_spare(
            svc, plan, policy.max_waiting, policy.max_kv_usage
        ):
            return 0
        return policy.concurrency - self._per_batch.get(batch.id, 0)

    async def _start(self, svc: Services, store: BatchStore, batch: Batch) -> None:
        free = self.slots(svc, batch)
        if free <= 0:
            return
        for item in await store.claim(batch.id, free, svc.policy.batches.lease_s):
            self._running[(item.batch_id, item.idx)] = item
            self._per_batch[batch.id] = self._per_batch.get(batch.id, 0) + 1
            svc.tasks.spawn(self._one(svc, store, batch, item))

    async def _one(self, svc: Services, store: BatchStore, batch: Batch, item: Claimed) -> None:
        try:
            svc.limits.release(svc.batch_holds.take(batch.id, item.idx))  # the run reserves for itself
            status, result, row = await batch_items.run(svc, batch, item)
            data = None if row is None else batch_items.row_json(row)
            if await store.complete(item, status, result, data) and row is not None:
                await svc.ledger.submit(row)
                self._billed.append((item.batch_id, item.idx))
        except asyncio.CancelledError:  # the gateway is stopping: pending again, for the next start
            with contextlib.suppress(Exception):
                await asyncio.shield(store.release([item]))
            raise
        finally:
            self._running.pop((item.batch_id, item.idx), None)
            self._per_batch[batch.id] -= 1
            if not self._per_batch[batch.id]:
                del self._per_batch[batch.id]


def engines_spare(svc: Services, plan: Any, max_waiting: int, max_kv: float) -> bool:
    """Every probed self-hosted engine among the plan's targets has room: its queue and KV
    cache use at most the limits on every replica (an engine not probed yet: no)."""
    engines = svc.engines.engines
    for target in plan.targets:
        state = engines.get(target.provider)
        if state is None:
            continue
        for replica in state.replicas:
            v = replica.values()
            waiting, kv = v["queue_depth"], v["kv_cache_usage"]
            if waiting is None or kv is None or waiting > max_waiting or kv > max_kv:
                return False
    return True


async def bill(svc: Services, store: BatchStore) -> None:
    """Hand the ledger the rows of finished items it may not have (a crash came between the
    item's commit and the ledger's); the ledger skips a request id it already has."""
    while True:
        rows = await store.unbilled(BILL_CHUNK)
        if not rows:
            return
        for _, _, data in rows:
            await svc.ledger.submit(batch_items.row_of(data))
        await store.mark_billed([(b, i) for b, i, _ in rows])
        if len(rows) < BILL_CHUNK:
            return


async def finalise(svc: Services, store: BatchStore, batch: Batch) -> None:
    """Nothing left to run: the final status and, for OpenAI, the output and error files."""
    now = time.time()
    batch_budget.release(svc, svc.batch_holds.take_all(batch.id))
    batch.times.setdefault("finalizing_at", now)
    if batch.api == "openai" and svc.files is not None:
        out, err = bytearray(), bytearray()
        after = 0
        while True:
            chunk = await store.results(batch.id, after, 1000)
            for item in chunk:
                ok, line = wire.openai_line(batch.id, item)
                (out if ok else err).extend(line)
            if len(chunk) < 1000:
                break
            after = chunk[-1].idx + 1
        if out:
            batch.output_file_id = (
                await svc.files.put(batch.tenant, "batch_output", f"{batch.id}_output.jsonl", bytes(out))
            )["id"]
        if err:
            batch.error_file_id = (
                await svc.files.put(batch.tenant, "batch_output", f"{batch.id}_error.jsonl", bytes(err))
            )["id"]
    if batch.status == "cancelling":
        batch.status, batch.times["cancelled_at"] = "cancelled", now
    elif "expired_at" in batch.times:
        batch.status = "expired"
    else:
        batch.status, batch.times["completed_at"] = "completed", now
    await store.save(batch)
