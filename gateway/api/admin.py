"""Admin API (keys, budgets, spend, savings; JSON or CSV): thin handlers over the use cases in
gateway/flow/admin.py. Every route needs the admin key (gateway/api/auth.py, require_admin)."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from gateway.api.auth import require_admin
from gateway.api.state import AppState
from gateway.core.errors import BadRequestError
from gateway.flow import admin
from gateway.flow.services import Services
from gateway.limits.keys import KeyLimits
from gateway.routing.learned_routes import SNAPSHOT_COLUMNS

router = APIRouter()
JSON = "application/json"


def _admin(request: Request) -> Services:
    state: AppState = request.app.state.sy
    svc = state.services
    require_admin(request.headers, svc.settings.admin_key)
    return svc


# ---------------------------------------------------------------------------- rendering
def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, default=_default), status_code=status, media_type=JSON)


def _default(obj: Any) -> Any:
    if isinstance(obj, Decimal):
        return f"{obj:f}"
    raise TypeError


def _table(
    request: Request,
    name: str,
    rows: list[dict[str, Any]],
    extra: dict[str, Any],
    columns: tuple[str, ...] | None = None,
) -> Response:
    fmt = request.query_params.get("format", "json")
    if fmt == "csv":
        return Response(
            admin.csv_table(rows, columns),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{name}.csv"'},
        )
    if fmt != "json":
        raise BadRequestError("format must be 'json' or 'csv'", param="format")
    return _json({**extra, name: rows})


# ---------------------------------------------------------------------------- bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_RATE = 10**9  # requests or tokens per minute: more is no limit at all, and breaks counters
MAX_USD = Decimal(10**9)  # larger budgets overflow the nanos and float gauges of /admin/budgets, /metrics


class LimitsBody(_Body):
    rpm: int | None = Field(default=None, gt=0, le=MAX_RATE, strict=True)
    tpm: int | None = Field(default=None, gt=0, le=MAX_RATE, strict=True)
    daily_usd: Decimal | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)
    monthly_usd: Decimal | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)

    def limits(self) -> KeyLimits:
        return KeyLimits(self.rpm, self.tpm, self.daily_usd, self.monthly_usd)


class CreateKeyBody(LimitsBody):
    tenant: str
    name: str | None = None


async def _parse(request: Request, model: type[_Body]) -> Any:
    raw = await request.body()
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        raise BadRequestError(f"{where or 'body'}: {err['msg']}", param=where) from None


# ---------------------------------------------------------------------------- keys
@router.get("/admin/keys")
async def list_keys(request: Request) -> Response:
    svc = _admin(request)
    include = request.query_params.get("all", "").lower() in ("1", "true", "yes")
    keys = admin.list_keys(svc.keys.store, include)
    return _json({"keys": [admin.key_json(rec, limits) for rec, limits in keys]})


@router.post("/admin/keys")
async def create_key(request: Request) -> Response:
    svc = _admin(request)
    body: CreateKeyBody = await _parse(request, CreateKeyBody)
    limits = body.limits()
    key, rec = admin.create_key(svc.keys.store, body.tenant, body.name, limits)
    if not limits.empty:
        svc.limits.refresh_key_limits()
    return _json({"key": key, **admin.key_json(rec, limits)}, status=201)


@router.delete("/admin/keys/{key_id}")
async def revoke_key(request: Request, key_id: str) -> Response:
    svc = _admin(request)
    admin.revoke_key(svc.keys.store, key_id)
    svc.keys.clear()
    svc.limits.refresh_key_limits()
    return _json({"key_id": key_id, "revoked": True})


@router.put("/admin/keys/{key_id}/limits")
async def set_key_limits(request: Request, key_id: str) -> Response:
    svc = _admin(request)
    body: LimitsBody = await _parse(request, LimitsBody)
    admin.set_key_limits(svc.keys.store, key_id, body.limits())
    svc.limits.refresh_key_limits()
    return _json({"key_id": key_id, "limits": admin.limits_json(body.limits())})


# ---------------------------------------------------------------------------- reports
@router.get("/admin/budgets")
async def list_budgets(request: Request) -> Response:
    svc = _admin(request)
    svc.limits.refresh_key_limits()
    return _table(request, "budgets", await svc.limits.status(svc.policy), {})


@router.get("/admin/spend")
async def spend(request: Request) -> Response:
    svc = _admin(request)
    group = request.query_params.get("group_by", "model")
    bucket = request.query_params.get("bucket", "day")
    start = admin.since(request.query_params.get("since", "30d"))
    limit = admin.top(request.query_params.get("limit"))
    await asyncio.to_thread(svc.ledger.flush, 2.0)
    rows = await asyncio.to_thread(admin.spend, svc.settings.ledger_url, group, bucket, start, limit)
    return _table(request, "spend", rows, {"group_by": group, "bucket": bucket}, admin.SPEND_COLUMNS)


@router.get("/admin/quality")
async def quality(request: Request) -> Response:
    svc = _admin(request)
    group = request.query_params.get("group_by", "model")
    start = admin.since(request.query_params.get("since", "30d"))
    limit = admin.top(request.query_params.get("limit"))
    await asyncio.to_thread(svc.ledger.flush, 2.0)
    rows = await asyncio.to_thread(admin.quality, svc.settings.ledger_url, group, start, limit)
    return _table(request, "quality", rows, {"group_by": group}, admin.QUALITY_COLUMNS)


@router.get("/admin/learned")
async def learned(request: Request) -> Response:
    """The learned routes' plans on this replica (``routing/learned_routes.snapshot``)."""
    svc = _admin(request)
    route, tenant = request.query_params.get("route"), request.query_params.get("tenant")
    rows = svc.learned.snapshot(route or None, tenant or None)
    return _table(request, "learned", rows, {}, SNAPSHOT_COLUMNS)


@router.get("/admin/savings")
async def savings(request: Request) -> Response:
    svc = _admin(request)
    bucket = request.query_params.get("bucket", "none")
    start = admin.since(request.query_params.get("since", "30d"))
    await asyncio.to_thread(svc.ledger.flush, 2.0)
    rows = await asyncio.to_thread(admin.savings, svc.settings.ledger_url, bucket, start)
    return _table(request, "savings", rows, {"bucket": bucket}, admin.SAVINGS_COLUMNS)
