"""The Files and Batch APIs' use cases (no HTTP): upload, list, read and delete a tenant's
files; create, retrieve, list and cancel batches, OpenAI's (over an uploaded JSONL file) and
Anthropic's Message Batches (the requests in the body); an Anthropic batch's results.
Everything is per tenant: another tenant's id is not found. The items run later
(gateway/flow/batch_runner.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.core.batch import OPEN, Batch, NewItem
from gateway.core.errors import BadRequestError, NotConfiguredError, NotFoundError
from gateway.core.ports_batch import BatchStore, FileStore
from gateway.core.types import Principal
from gateway.flow import batch_budget
from gateway.flow.services import Services
from gateway.protocols import batches as wire
from gateway.protocols.ids import random_hex

PURPOSES = ("batch",)  # what an upload may be for (batch outputs are written by the gateway)


def _files(svc: Services) -> FileStore:
    if svc.files is None:
        raise NotConfiguredError("The Files API is not available on this gateway")
    return svc.files


def _store(svc: Services) -> BatchStore:
    if svc.batches is None:
        raise NotConfiguredError("The Batch API needs a ledger (SWITCHYARD_LEDGER is 'none')")
    return svc.batches


# --------------------------------------------------------------------------- files
async def upload(svc: Services, tenant: str, purpose: str, filename: str, data: bytes) -> dict[str, Any]:
    if purpose not in PURPOSES:
        raise BadRequestError(
            f"Invalid purpose '{purpose}': supported values are {list(PURPOSES)}", param="purpose"
        )
    if not data.strip():
        raise BadRequestError("The file is empty", param="file")
    return await _files(svc).put(tenant, purpose, filename, data)


async def file_of(svc: Services, tenant: str, file_id: str) -> dict[str, Any]:
    meta = await _files(svc).get(tenant, file_id)
    if meta is None:
        raise NotFoundError(f"No such File object: {file_id}", param="id", code="not_found")
    return meta


async def file_content(svc: Services, tenant: str, file_id: str) -> bytes:
    data = await _files(svc).content(tenant, file_id)
    if data is None:
        raise NotFoundError(f"No such File object: {file_id}", param="id", code="not_found")
    return data


async def list_files(
    svc: Services, tenant: str, purpose: str | None, after: str | None, limit: int, order: str
) -> dict[str, Any]:
    files = await _files(svc).listing(tenant, purpose)
    if order == "asc":
        files.reverse()
    if after is not None:
        ids = [f["id"] for f in files]
        files = files[ids.index(after) + 1 :] if after in ids else []
    page = files[:limit]
    return {
        "object": "list",
        "data": page,
        "has_more": len(files) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


async def delete_file(svc: Services, tenant: str, file_id: str) -> dict[str, Any]:
    if not await _files(svc).delete(tenant, file_id):
        raise NotFoundError(f"No such File object: {file_id}", param="id", code="not_found")
    return {"id": file_id, "object": "file", "deleted": True}


# --------------------------------------------------------------------------- batches
def _new(who: Principal, api: str, endpoint: str, model: str | None, window: str, **kw: Any) -> Batch:
    now = time.time()
    prefix = "batch_" if api == "openai" else "msgbatch_"
    return Batch(
        id=prefix + random_hex(12),
        tenant=who.tenant,
        key_id=who.key_id,
        api=api,
        endpoint=endpoint,
        model=model,
        completion_window=window,
        status="in_progress",
        created_at=now,
        expires_at=now + wire.window_seconds(window),
        times={"in_progress_at": now},
        **kw,
    )


async def create_openai(svc: Services, who: Principal, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError("The request body must be a JSON object")
    endpoint, window, file_id = body.get("endpoint"), body.get("completion_window"), body.get("input_file_id")
    if endpoint not in wire.OPENAI_ENDPOINTS:
        raise BadRequestError(
            f"Invalid endpoint '{endpoint}': supported values are {list(wire.OPENAI_ENDPOINTS)}",
            param="endpoint",
        )
    if not isinstance(window, str):
        raise BadRequestError("Missing required parameter: 'completion_window'", param="completion_window")
    wire.window_seconds(window)
    if not isinstance(file_id, str):
        raise BadRequestError("Missing required parameter: 'input_file_id'", param="input_file_id")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise BadRequestError("'metadata': at most 16 string keys with string values", param="metadata")
    meta = await file_of(svc, who.tenant, file_id)
    if meta.get("purpose") != "batch":
        raise BadRequestError(
            f"The file {file_id} was not uploaded with purpose 'batch'", param="input_file_id"
        )
    data = await file_content(svc, who.tenant, file_id)
    # off the loop: checking tens of thousands of lines takes a while (live traffic goes on)
    items, errors, model = await asyncio.to_thread(
        wire.openai_items, data, endpoint, svc.policy.batches.max_items
    )
    batch = _new(
        who,
        "openai",
        endpoint,
        model,
        window,
        input_file_id=file_id,
        metadata=metadata,
        errors=errors or None,
    )
    await _create(svc, who, batch, items)
    return wire.openai_batch(batch, _counts(items))


async def create_anthropic(svc: Services, who: Principal, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequestError("The request body must be a JSON object")
    items, model = await asyncio.to_thread(
        wire.anthropic_items, body.get("requests"), svc.policy.batches.max_items
    )
    batch = _new(who, "anthropic", "/v1/messages", model, "24h", input_file_id=None, metadata=None)
    await _create(svc, who, batch, items)
    return wire.anthropic_batch(batch, _counts(items), results_url(batch.id))


async def _create(svc: Services, who: Principal, batch: Batch, items: list[NewItem]) -> None:
    """Reserve the batch's worst case (refused whole when the budgets cannot hold it), then
    store it; its items run from the next turn of the runner."""
    store = _store(svc)
    holds = await batch_budget.reserve(svc, who, batch.endpoint, items)
    try:
        await store.create(batch, items)
    except BaseException:
        batch_budget.release(svc, list(holds.values()))
        raise
    if holds:
        svc.batch_holds.held[batch.id] = holds


def _counts(items: list[NewItem]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item.status] = out.get(item.status, 0) + 1
    return out


def results_url(batch_id: str) -> str:
    return f"/v1/messages/batches/{batch_id}/results"


async def _batch(svc: Services, tenant: str, api: str, batch_id: str) -> Batch:
    batch = await _store(svc).get(tenant, batch_id)
    if batch is None or batch.api != api:
        if api == "anthropic":
            raise NotFoundError(f"No message batch found with id '{batch_id}'", code="not_found")
        raise NotFoundError(f"No batch found with id '{batch_id}'", param="batch_id", code="not_found")
    return batch


async def show(svc: Services, batch: Batch) -> dict[str, Any]:
    counts = await _store(svc).counts(batch.id)
    if batch.api == "anthropic":
        return wire.anthropic_batch(batch, counts, results_url(batch.id))
    return wire.openai_batch(batch, counts)


async def retrieve(svc: Services, tenant: str, api: str, batch_id: str) -> dict[str, Any]:
    return await show(svc, await _batch(svc, tenant, api, batch_id))


async def cancel(svc: Services, tenant: str, api: str, batch_id: str) -> dict[str, Any]:
    """Items not yet run end as canceled (the runner does it on its next turn); the running
    ones finish. A batch that ended already is shown as it is."""
    batch = await _batch(svc, tenant, api, batch_id)
    if batch.status in OPEN and batch.status != "cancelling":
        batch.status = "cancelling"
        batch.times["cancelling_at"] = time.time()
        await _store(svc).save(batch)
    return await show(svc, batch)


async def list_batches(svc: Services, tenant: str, api: str, after: str | None, limit: int) -> dict[str, Any]:
    batches = await _store(svc).page(tenant, api, after, limit + 1)
    page = [await show(svc, b) for b in batches[:limit]]
    return {
        "object": "list",
        "data": page,
        "has_more": len(batches) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


async def anthropic_results(svc: Services, tenant: str, batch_id: str) -> AsyncIterator[bytes]:
    """An ended Message Batch's results, one JSONL line per request in input order."""
    batch = await _batch(svc, tenant, "anthropic", batch_id)
    if batch.status in OPEN:
        raise BadRequestError(f"Message batch {batch_id} is still processing: its results are not ready")
    store = _store(svc)

    async def lines() -> AsyncIterator[bytes]:
        after = 0
        while True:
            chunk = await store.results(batch.id, after, 1000)
            for item in chunk:
                yield wire.anthropic_line(item)
            if len(chunk) < 1000:
                return
            after = chunk[-1].idx + 1

    return lines()
