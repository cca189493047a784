"""Lane ``provider``: a batch sent whole to its route's first target's provider's own batch
API (OpenAI's Files + Batches; Anthropic's Message Batches for Messages items), each item
priced at the provider's batch price (the model's ``price.batch`` share of its list price;
savings cause ``batch``).

``submit`` claims every item still to run (with a lease to the end of the completion window),
applies the route's params, names the upstream model and uploads them as one batch; the
provider's batch id is kept on the batch (``Batch.upstream``). ``poll`` reads its status each
turn; once it has ended the output and error files are read and every item completed with
its result and its ledger row in one transaction, as the other lanes do: metering
(flow/metering.py) writes the row from the item's usage at the batch price, and settles the
budget hold the item got when the batch was created. Items the provider did not run (it
expired or was cancelled) end as ``expired``/``canceled``.

The intent is written before the provider's batch is created (``Batch.upstream`` without an
``id``), and the batch is tagged with the gateway's batch id and that intent (OpenAI's batch
``metadata``). So when the gateway dies (or the create times out) between the creation and the
note of its id, ``resume`` finds the provider's batch by its tags and follows it instead of
creating a second one; none found: the items are given back and sent in a new batch.
Anthropic's Message Batches keep no metadata: there a cut create is sent again."""

from __future__ import annotations

import dataclasses
import secrets
import time
from decimal import Decimal
from typing import Any

import orjson

from gateway.core.batch import Batch, Claimed, request_id_of
from gateway.core.ports_batch import BatchStore, BatchUpstream
from gateway.core.redact import redact
from gateway.core.types import (
    Price,
    Principal,
    Target,
    usage_from_anthropic,
    usage_from_openai,
    usage_from_responses,
)
from gateway.flow import batch_items
from gateway.flow.exchange import Exchange
from gateway.flow.metering import record
from gateway.flow.services import Services
from gateway.protocols import batches as wire
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan

TIMEOUT_S = 120.0
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
PROCESS = secrets.token_hex(6)  # this process: an intent it left is not in flight anywhere
# An intent left by another process is resumed once its create must have ended (upload and
# create, TIMEOUT_S each): before that, another replica may still be creating it.
FOREIGN_INTENT_S = 2 * TIMEOUT_S + 30.0


def upstream_of(svc: Services, plan: RoutePlan, endpoint: str) -> tuple[Target, BatchUpstream] | None:
    """The route's first target when its provider's batch API runs ``endpoint`` and the model
    has a batch price."""
    target = plan.targets[0] if plan.targets else None
    if target is None or target.price.batch is None:
        return None
    upstream = svc.batch_upstreams.get(target.provider)
    return None if upstream is None or endpoint not in upstream.endpoints else (target, upstream)


async def submit(
    svc: Services, store: BatchStore, batch: Batch, plan: RoutePlan, target: Target, upstream: BatchUpstream
) -> None:
    lease = max(60.0, batch.expires_at - time.time()) + 3600.0
    claimed = await store.claim(batch.id, svc.policy.batches.max_items, lease)
    if not claimed:
        return
    lines = []
    for item in claimed:
        names = (
            batch_items.ADAPTERS[wire.endpoint_kind(batch.endpoint)].names
            if batch.endpoint != "/v1/embeddings"
            else None
        )
        body = apply_params(orjson.loads(item.body), plan.policy.params, names)
        body["model"] = target.upstream_model
        line = {"custom_id": str(item.idx), "method": "POST", "url": batch.endpoint, "body": body}
        lines.append(orjson.dumps(line))
    up = {
        "provider": target.provider, "model": target.model, "intent": secrets.token_hex(8),
        "owner": PROCESS, "since": time.time(), "attempts": {str(i.idx): i.attempt for i in claimed},
    }  # fmt: skip
    batch.upstream = up
    await store.set_upstream(batch.id, up)  # the intent first: a cut create is found again
    # a failure leaves the intent: the next turn looks for the batch (resume), then sends again
    up["id"] = await upstream.submit(batch.endpoint, b"\n".join(lines) + b"\n", TIMEOUT_S, tags(batch.id, up))
    await store.set_upstream(batch.id, up)


def tags(batch_id: str, up: dict[str, Any]) -> dict[str, str]:
    """The metadata the provider's batch carries: the gateway's batch and the intent."""
    return {"switchyard_batch": batch_id, "switchyard_intent": str(up["intent"])}


async def resume(svc: Services, store: BatchStore, batch: Batch) -> None:
    """An intent with no provider batch id (the create was cut): follow the batch the
    provider made for it, or, when it made none, give the items back to be sent again."""
    up = batch.upstream
    assert up is not None
    upstream = svc.batch_upstreams.get(up["provider"])
    if upstream is None:
        return
    if up.get("owner") != PROCESS and time.time() - float(up.get("since", 0)) < FOREIGN_INTENT_S:
        return  # another replica may be creating it right now
    try:
        found = await upstream.find(tags(batch.id, up), float(up.get("since", 0)), TIMEOUT_S)
    except NotImplementedError:  # no metadata at this provider: it cannot be found
        found = None
    if found is not None:
        up["id"] = found
        await store.set_upstream(batch.id, up)
        return
    await store.release([Claimed(batch.id, int(i), None, b"", int(a)) for i, a in up["attempts"].items()])
    batch.upstream = None
    await store.set_upstream(batch.id, None)


async def poll(svc: Services, store: BatchStore, batch: Batch, plan: RoutePlan) -> list[tuple[str, int]]:
    """Follow the provider's batch; once it ended, complete its items. The (batch, index) of
    the items whose rows went to the ledger."""
    up = batch.upstream
    assert up is not None
    upstream = svc.batch_upstreams.get(up["provider"])
    if upstream is None or up.get("done"):
        return []
    if "id" not in up:  # the create was cut
        await resume(svc, store, batch)
        return []
    if batch.status == "cancelling" and not up.get("cancel_sent"):
        await upstream.cancel(up["id"], TIMEOUT_S)
        up["cancel_sent"] = True
        await store.set_upstream(batch.id, up)
    info = await upstream.status(up["id"], TIMEOUT_S)
    if info.get("status") not in ENDED:
        return []
    answers: dict[int, dict[str, Any]] = {}
    for key in ("output_file_id", "error_file_id"):
        if info.get(key):
            for raw in (await upstream.content(str(info[key]), TIMEOUT_S)).splitlines():
                line = orjson.loads(raw) if raw.strip() else None
                if isinstance(line, dict) and str(line.get("custom_id", "")).isdigit():
                    answers[int(line["custom_id"])] = line
    target = next((t for t in plan.targets if t.model == up["model"]), plan.targets[0])
    billed = []
    for idx_text, attempt in up["attempts"].items():
        idx = int(idx_text)
        item = Claimed(batch.id, idx, None, b"", int(attempt))
        line = answers.get(idx)
        row = None
        if line is None:  # the provider did not run it
            status = "canceled" if info["status"] == "cancelled" else "expired"
            result = wire.closed(status)
        else:
            status, result, row = _metered(svc, batch, plan, target, idx, line)
        data = None if row is None else batch_items.row_json(row)
        if await store.complete(item, status, result, data) and row is not None:
            await svc.ledger.submit(row)
            billed.append((batch.id, idx))
    up["done"] = True
    await store.set_upstream(batch.id, up)
    return billed


def batch_price(price: Price) -> Price:
    """``price`` at the provider's batch share (``price.batch``)."""
    share = price.batch if price.batch is not None else Decimal(1)

    def scale(v: Decimal | None) -> Decimal | None:
        return None if v is None else v * share

    return Price(
        price.input * share,
        price.output * share,
        scale(price.cached_input),
        scale(price.cache_write),
        scale(price.cache_write_1h),
    )


def _metered(
    svc: Services, batch: Batch, plan: RoutePlan, target: Target, idx: int, line: dict[str, Any]
) -> tuple[str, bytes, Any]:
    """The item's status, stored result and ledger row (metering at the batch price)."""
    rid = request_id_of(batch.id, idx)
    response = line.get("response") if isinstance(line.get("response"), dict) else None
    code = int(response.get("status_code", 500)) if response else 500
    body = response.get("body") if response else {"error": line.get("error")}
    if code != 200:  # an error line: upstreams echo keys in errors, never stored as sent
        body = _scrubbed(body, svc.secrets)
    held = batch_items.HeldLedger(svc.ledger)
    local = dataclasses.replace(svc, ledger=held)
    who = Principal(batch.tenant, batch.key_id, svc.policy.allowed_models(batch.tenant))
    ex = Exchange(rid, who, time.perf_counter(), time.time())
    ex.endpoint = "embeddings" if batch.endpoint == "/v1/embeddings" else wire.endpoint_kind(batch.endpoint)
    ex.requested, ex.plan, ex.attempts, ex.batch_priced = str(batch.model), plan, 1, True
    ex.target = dataclasses.replace(target, price=batch_price(target.price))
    ex.reservation = svc.batch_holds.take(batch.id, idx)  # settled to the real cost by metering
    read = {"/v1/responses": usage_from_responses, "/v1/messages": usage_from_anthropic}.get(
        batch.endpoint, usage_from_openai
    )
    usage = read(body.get("usage")) if isinstance(body, dict) else None
    if usage is not None:
        ex.usage = usage
    if code != 200:
        ex.status, ex.http_status = "error", code
    record(local, ex)
    row = None if held.row is None else dataclasses.replace(held.row, batch_id=batch.id)
    return ("succeeded" if code == 200 else "errored"), wire.ran(code, rid, body), row


def _scrubbed(value: Any, secrets_: tuple[str, ...]) -> Any:
    """``value`` with every string in it redacted (gateway/core/redact.py)."""
    if isinstance(value, str):
        return redact(value, secrets_)
    if isinstance(value, dict):
        return {k: _scrubbed(v, secrets_) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, secrets_) for v in value]
    return value
