"""The stored responses behind ``previous_response_id`` (``GET``/``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items``); creating one is the pipeline's (adapters/responses.py)."""

from __future__ import annotations

from gateway.core.ports import StoredResponse
from gateway.flow.adapters.responses import not_found
from gateway.flow.services import Services
from gateway.protocols.openai_responses import Item


async def _stored(svc: Services, tenant: str, rid: str) -> StoredResponse:
    stored = await svc.responses.get(tenant, rid) if svc.responses is not None else None
    if stored is None:
        raise not_found(rid)
    return stored


async def retrieve(svc: Services, tenant: str, rid: str) -> Item:
    return (await _stored(svc, tenant, rid)).response


async def delete(svc: Services, tenant: str, rid: str) -> Item:
    if svc.responses is None or not await svc.responses.delete(tenant, rid):
        raise not_found(rid)
    return {"id": rid, "object": "response.deleted", "deleted": True}


async def list_input_items(
    svc: Services, tenant: str, rid: str, *, limit: int = 20, order: str = "desc", after: str | None = None
) -> Item:
    """``GET /v1/responses/{id}/input_items``: the request's own input items, a list object."""
    items = list((await _stored(svc, tenant, rid)).input_items)
    if order != "asc":
        items.reverse()
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
