"""The Batch API's runner: one loop per gateway process that moves the open batches on.

Each turn it hands the ledger the rows of finished items it may not have yet (after a crash),
then for every open batch: ends what a cancel or an expired ``completion_window`` left
unrun, claims items up to what the batch's lane allows now and runs each
(gateway/flow/batch_items.py), and finalises a batch with nothing left to run (OpenAI: its
output and error files).

Lanes (the route's ``batch`` policy): ``low_priority`` runs at most ``concurrency`` items at a
time and none while ``yield_above`` interactive requests are in flight; ``self_hosted`` also
waits until every self-hosted engine of the route shows spare capacity (its queue and KV
cache use, as gateway/routing/engine_load.py reads them).

The loop turns every ``batches.poll_interval_s`` while a batch is open; with none it backs
off (doubling up to ``batches.idle_poll_s``), and a batch created or cancelled here wakes it
at once (``wake``), one created on another replica is seen within ``idle_poll_s``. A batch
whose key was revoked stops: its items not yet run fail with the revocation error and what
the budgets held for them is released."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config.route_extras import RouteBatchPolicy
from gateway.core.batch import Batch, Claimed
from gateway.core.errors import SwitchyardError
from gateway.core.ports_batch import BatchStore
from gateway.core.types import Principal
from gateway.flow import batch_budget, batch_forward, batch_items
from gateway.flow.services import Services
from gateway.protocols import batches as wire
from gateway.routing.plan import RoutePlan

log = logging.getLogger("switchyard")
BILL_CHUNK = 500
KEYS_EVERY_S = 1.0  # how often the key store's change counter is read while batches are open
REVOKED: bytes = orjson.dumps(
    {
        "error": {
            "code": "invalid_api_key",
            "message": "The API key that created this batch was revoked: this request was not run.",
        }
    }
)


class BatchRunner:
    def __init__(self, services: Callable[[], Services]) -> None:
        self.services = services
        self.interactive: Callable[[], int] = lambda: 0  # requests in flight (set by the API layer)
        self._running: dict[tuple[str, int], Claimed] = {}
        self._per_batch: dict[str, int] = {}
        self._billed: list[tuple[str, int]] = []  # in the ledger: marked billed next turn, together
        self._recovered = False
        self._polled: dict[str, float] = {}  # lane provider: when each batch's upstream was last read
        self._wake = asyncio.Event()
        self._keys_read = -KEYS_EVERY_S
        self._keys_version: int | None = None
        self._revoked: frozenset[str] = frozenset()
        self.turns = 0  # turns taken (tests, diagnostics)

    def wake(self) -> None:
        """A batch was created or cancelled here: turn now rather than at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled (an item cut by the shutdown gives its claim back itself)."""
        delay = 0.0
        while True:
            svc = self.services()
            self._wake.clear()
            busy = True
            if svc.batches is not None:
                try:
                    busy = await self.turn(svc, svc.batches)
                except Exception:  # a turn must never stop the loop (a database blip)
                    log.exception("batch runner turn failed")
            conf = svc.policy.batches
            if busy:
                delay = conf.poll_interval_s
            else:  # nothing open: back off, up to idle_poll_s
                delay = min(max(delay * 2, conf.poll_interval_s), max(conf.idle_poll_s, conf.poll_interval_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def turn(self, svc: Services, store: BatchStore) -> bool:
        """Move every open batch on; whether any batch is open (or an item still runs)."""
        self.turns += 1
        if not self._recovered:  # once per process: rows a crash left between item and ledger
            await bill(svc, store)
            self._recovered = True
        billed, self._billed = self._billed, []
        if billed:
            await store.mark_billed(billed)
        now = time.time()
        batches = await store.open_batches()
        revoked = await self._revoked_keys(svc) if any(b.key_id for b in batches) else frozenset()
        for batch in batches:
            if batch.key_id in revoked and batch.status in ("in_progress", "cancelling"):
                await self._stop_revoked(svc, store, batch)
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
        return bool(batches or self._running or self._billed)

    async def _revoked_keys(self, svc: Services) -> frozenset[str]:
        """The revoked key ids, read again when the key store's change counter moved (as the
        replica's KeyWatch last read it; without one, read here at most every KEYS_EVERY_S);
        the last known set while the store is unreachable."""
        store = svc.keys.store
        watched = svc.keys.version
        if watched is None:
            now = time.monotonic()
            if now - self._keys_read < KEYS_EVERY_S:
                return self._revoked
            self._keys_read = now
        elif watched == self._keys_version:
            return self._revoked
        try:
            version = watched if watched is not None else await asyncio.to_thread(store.version)
            if version != self._keys_version:
                records = await asyncio.to_thread(store.list, True)
                self._revoked = frozenset(r.key_id for r in records if r.revoked)
                self._keys_version = version
        except Exception as exc:  # the key store is down: the key cache's outage rules apply
            log.warning("batch runner: key store unreachable (%s)", type(exc).__name__)
        return self._revoked

    async def _stop_revoked(self, svc: Services, store: BatchStore, batch: Batch) -> None:
        """The batch's key was revoked: its items not yet run fail with the revocation error
        and their budget holds are released (running ones finish); a batch at the provider is
        cancelled there."""
        if batch.upstream is not None:
            if batch.status != "cancelling":
                batch.status = "cancelling"
                batch.times["cancelling_at"] = time.time()
                await store.save(batch)
            return
        if await store.close_pending(batch.id, "errored", REVOKED):
            log.info("batch %s stopped: its key %s was revoked", batch.id, batch.key_id)
        batch_budget.release(svc, svc.batch_holds.take_all(batch.id))

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
        route = self.route(svc, batch)
        resend = route is None or route[1].on_interrupted == "resend"
        for item in await store.claim(batch.id, free, svc.policy.batches.lease_s):
            self._running[(item.batch_id, item.idx)] = item
            self._per_batch[batch.id] = self._per_batch.get(batch.id, 0) + 1
            svc.tasks.spawn(self._one(svc, store, batch, item, resend))

    async def _one(self, svc: Services, store: BatchStore, batch: Batch, item: Claimed, resend: bool) -> None:
        try:
            svc.limits.release(svc.batch_holds.take(batch.id, item.idx))  # the run reserves for itself
            if item.interrupted and not resend:  # it may have run upstream: not paid twice
                status, result = batch_items.interrupted(batch, item)
                row = None
            else:  # sent again under the same idempotency key, when it was sent before
                status, result, row = await batch_items.run(svc, batch, item, store)
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
