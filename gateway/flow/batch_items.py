"""One Batch API item, run as an ordinary request of its batch's tenant and key through the
ONE pipeline (``pipeline.serve`` with the endpoint's adapter; embeddings ``passthrough``), so
params, limits, budgets, caches and metering hold for it as for any request.

Its ledger row is not committed by metering: a ``HeldLedger`` keeps it, and the runner writes
it with the item's result in one transaction of the batch store before the ledger gets it
(gateway/ledger/batches.py tells why)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from decimal import Decimal
from typing import Any

import orjson

from gateway.core.batch import BATCH_ITEM, Batch, Claimed, ItemCall, request_id_of
from gateway.core.errors import SwitchyardError
from gateway.core.ledger_row import LedgerRow
from gateway.core.ports import Ledger
from gateway.core.ports_batch import BatchStore
from gateway.core.types import Principal
from gateway.flow import pipeline
from gateway.flow.adapters.base import Inbound
from gateway.flow.adapters.chat import Chat
from gateway.flow.adapters.messages import Messages
from gateway.flow.adapters.responses import Responses
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from gateway.protocols import batches as wire
from gateway.protocols.anthropic_messages import error_body

ADAPTERS: dict[str, type[Inbound]] = {"chat": Chat, "messages": Messages, "responses": Responses}
_MONEY = ("cost_usd", "baseline_cost_usd")


class HeldLedger:
    """The ledger port for one item's request: ``submit`` keeps the row (it is committed later
    with the item's result); everything else is the real ledger's."""

    def __init__(self, inner: Ledger) -> None:
        self.inner = inner
        self.phase = inner.phase
        self.row: LedgerRow | None = None

    def submit(self, row: LedgerRow) -> Awaitable[bool]:
        self.row = row
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    def start(self) -> None:
        self.inner.start()

    def flush(self, timeout: float = 5.0) -> bool:
        return self.inner.flush(timeout)

    def pending(self) -> int:
        return self.inner.pending()

    def outbox_rows(self) -> int:
        return self.inner.outbox_rows()

    def healthy(self) -> bool:
        return self.inner.healthy()

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        return self.inner.spent_since(scope, since_ts)

    def close(self, timeout: float = 10.0) -> None:
        self.inner.close(timeout)


def row_json(row: LedgerRow) -> bytes:
    d = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    for name in _MONEY:
        d[name] = None if d[name] is None else f"{d[name]:f}"
    return orjson.dumps(d)


def row_of(data: bytes) -> LedgerRow:
    d: dict[str, Any] = orjson.loads(data)
    for name in _MONEY:
        d[name] = None if d[name] is None else Decimal(d[name])
    return LedgerRow(**d)


class ItemInterruptedError(SwitchyardError):
    """An item whose upstream call a crash or a shutdown cut, on a route that does not resend
    (``batch.on_interrupted: fail``)."""

    status = 409
    type = "server_error"
    code = "batch_item_interrupted"


def interrupted(batch: Batch, item: Claimed) -> tuple[str, bytes]:
    """The status and stored result of an interrupted item the route will not send again."""
    exc = ItemInterruptedError(
        "This request was sent upstream when the gateway stopped, and its answer was lost; the "
        "route's batch policy (on_interrupted: fail) does not send it again, since the upstream "
        "may have run and billed it. Submit it again if it is still wanted."
    )
    kind = wire.endpoint_kind(batch.endpoint)
    shown = error_body(exc) if kind == "messages" else exc.to_body()
    return "errored", wire.ran(exc.status, request_id_of(batch.id, item.idx), shown)


async def run(
    svc: Services, batch: Batch, item: Claimed, store: BatchStore | None = None
) -> tuple[str, bytes, LedgerRow | None]:
    """Run ``item``: (its final status, its stored result, its ledger row with the batch id).
    With ``store``, the item's send is recorded there before its first upstream call, and
    every upstream call carries the item's idempotency key (gateway/core/batch.py)."""
    held = HeldLedger(svc.ledger)
    local = dataclasses.replace(svc, ledger=held)
    rid = request_id_of(batch.id, item.idx)
    who = Principal(batch.tenant, batch.key_id, svc.policy.allowed_models(batch.tenant))
    ex = Exchange(rid, who, time.perf_counter(), time.time())
    body = orjson.loads(item.body)
    kind = wire.endpoint_kind(batch.endpoint)
    call = BATCH_ITEM.set(ItemCall(rid, None if store is None else lambda: store.mark_sent(item)))
    try:
        if kind == "embeddings":
            reply = await pipeline.passthrough(local, "embeddings", body, ex)
        else:
            reply = await pipeline.serve(local, ADAPTERS[kind](local, body, {}), ex)
        status, result = "succeeded", wire.ran(reply.status, rid, orjson.loads(reply.body or b"null"))
    except SwitchyardError as exc:
        shown = error_body(exc) if kind == "messages" else exc.to_body()
        status, result = "errored", wire.ran(exc.status, rid, shown)
    finally:
        BATCH_ITEM.reset(call)
    row = held.row
    if row is not None:
        row = dataclasses.replace(row, batch_id=batch.id)
    return status, result, row
