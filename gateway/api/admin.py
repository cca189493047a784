"""Admin API (keys, budgets, spend, savings; JSON or CSV) and the start-up wiring of limits
and tracing. Every route needs the admin key (Bearer, or HTTP Basic with the key as the
password so a browser can use /dashboard); it is compared in constant time."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import os
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from gateway.api.state import AppState
from gateway.config.settings import Secret
from gateway.core.errors import AuthenticationError, BadRequestError, NotFoundError, PermissionDeniedError
from gateway.ledger import query, report
from gateway.ledger.report import parse_since
from gateway.ledger.tokens import count_prompt_tokens
from gateway.limits.gate import Limits, prompt_token_bound
from gateway.limits.keys import KeyLimits, KeyRecord
from gateway.limits.redis_store import RedisStore
from gateway.telemetry.tracing import RequestTracer, build_tracer

log = logging.getLogger("switchyard")
router = APIRouter()
JSON = "application/json"


# ---------------------------------------------------------------------------- auth
def admin_credential(request: Request) -> str | None:
    """The admin key presented as a Bearer token or as the password of HTTP Basic auth."""
    auth = request.headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return request.headers.get("x-api-key") or None


def require_admin(request: Request, admin_key: Secret | None) -> None:
    if admin_key is None:
        raise PermissionDeniedError(
            "Admin API disabled: set SWITCHYARD_ADMIN_KEY to enable it", code="admin_disabled"
        )
    key = admin_credential(request)
    if key is None:
        raise AuthenticationError("Admin endpoints need the admin key", code="missing_api_key")
    if not hmac.compare_digest(key.encode(), admin_key.get().encode()):
        raise PermissionDeniedError("This key is not the admin key", code="not_admin")


def _admin(request: Request) -> AppState:
    state: AppState = request.app.state.sy
    require_admin(request, state.settings.admin_key)
    return state


# ---------------------------------------------------------------------------- rendering
def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, default=_default), status_code=status, media_type=JSON)


def _default(obj: Any) -> Any:
    if isinstance(obj, Decimal):
        return f"{obj:f}"
    raise TypeError


def to_csv(rows: list[dict[str, Any]]) -> str:
    return report.to_csv(
        [{k: (f"{v:f}" if isinstance(v, Decimal) else v) for k, v in r.items()} for r in rows]
    )


def _table(request: Request, name: str, rows: list[dict[str, Any]], extra: dict[str, Any]) -> Response:
    fmt = request.query_params.get("format", "json")
    if fmt == "csv":
        return Response(
            to_csv(rows),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{name}.csv"'},
        )
    if fmt != "json":
        raise BadRequestError("format must be 'json' or 'csv'", param="format")
    return _json({**extra, name: rows})


def _since(request: Request, default: str) -> float | None:
    text = request.query_params.get("since", default)
    if text == "all":
        return None
    try:
        return parse_since(text)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="since") from None


def _record_json(rec: KeyRecord, limits: KeyLimits | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key_id": rec.key_id,
        "tenant": rec.tenant,
        "name": rec.name,
        "created_at": rec.created_at,
        "revoked_at": rec.revoked_at,
    }
    if limits is not None:
        out["limits"] = _limits_json(limits)
    return out


def _limits_json(kl: KeyLimits) -> dict[str, Any]:
    return {"rpm": kl.rpm, "tpm": kl.tpm, "daily_usd": kl.daily_usd, "monthly_usd": kl.monthly_usd}


# ---------------------------------------------------------------------------- bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LimitsBody(_Body):
    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)
    daily_usd: Decimal | None = Field(default=None, gt=0, allow_inf_nan=False)
    monthly_usd: Decimal | None = Field(default=None, gt=0, allow_inf_nan=False)

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
    state = _admin(request)
    include = request.query_params.get("all", "").lower() in ("1", "true", "yes")
    store = state.keys.store
    records = store.list(include_revoked=include)
    limits = store.all_limits()
    return _json({"keys": [_record_json(r, limits.get(r.key_id, KeyLimits())) for r in records]})


@router.post("/admin/keys")
async def create_key(request: Request) -> Response:
    state = _admin(request)
    body: CreateKeyBody = await _parse(request, CreateKeyBody)
    try:
        key, rec = state.keys.store.create(body.tenant, body.name)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="tenant") from None
    limits = body.limits()
    if not limits.empty:
        state.keys.store.set_limits(rec.key_id, limits)
        state.pipeline.limits.refresh_key_limits()
    return _json({"key": key, **_record_json(rec, limits)}, status=201)


@router.delete("/admin/keys/{key_id}")
async def revoke_key(request: Request, key_id: str) -> Response:
    state = _admin(request)
    if not state.keys.store.revoke(key_id):
        raise NotFoundError(f"No active key with id '{key_id}'", code="key_not_found")
    state.keys.clear()
    state.pipeline.limits.refresh_key_limits()
    return _json({"key_id": key_id, "revoked": True})


@router.put("/admin/keys/{key_id}/limits")
async def set_key_limits(request: Request, key_id: str) -> Response:
    state = _admin(request)
    body: LimitsBody = await _parse(request, LimitsBody)
    if not state.keys.store.set_limits(key_id, body.limits()):
        raise NotFoundError(f"No active key with id '{key_id}'", code="key_not_found")
    state.pipeline.limits.refresh_key_limits()
    return _json({"key_id": key_id, "limits": _limits_json(body.limits())})


# ---------------------------------------------------------------------------- reports
@router.get("/admin/budgets")
async def list_budgets(request: Request) -> Response:
    state = _admin(request)
    state.pipeline.limits.refresh_key_limits()
    rows = await state.pipeline.limits.status(state.pipeline.runtime.policy)
    return _table(request, "budgets", rows, {})


@router.get("/admin/spend")
async def spend(request: Request) -> Response:
    state = _admin(request)
    group = request.query_params.get("group_by", "model")
    bucket = request.query_params.get("bucket", "day")
    since = _since(request, "30d")
    await asyncio.to_thread(state.ledger.flush, 2.0)
    try:
        url = state.settings.ledger_url
        rows = await asyncio.to_thread(report.spend_series, url, group, bucket, since)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    return _table(request, "spend", rows, {"group_by": group, "bucket": bucket})


@router.get("/admin/savings")
async def savings(request: Request) -> Response:
    state = _admin(request)
    bucket = request.query_params.get("bucket", "none")
    since = _since(request, "30d")
    await asyncio.to_thread(state.ledger.flush, 2.0)
    try:
        url = state.settings.ledger_url
        rows = await asyncio.to_thread(report.savings_by_cause, url, bucket, since)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="bucket") from None
    return _table(request, "savings", rows, {"bucket": bucket})


# ---------------------------------------------------------------------------- wiring
def prompt_tokens(body: Mapping[str, Any], model: str) -> int:
    """Prompt tokens for a budget reservation: the tokenizer's count plus 1/8 and 8 tokens of
    margin (other vendors' tokenizers count a little differently); the byte bound if the
    tokenizer fails."""
    try:
        n = count_prompt_tokens(dict(body), model)
    except Exception:
        return prompt_token_bound(body)
    return n + n // 8 + 8


async def start(app: FastAPI, state: AppState) -> None:
    """Build the limits (Redis when configured), seed budgets from the ledger, start tracing."""
    policy = state.pipeline.runtime.policy
    lp = policy.limits
    url = state.settings.redis_url or lp.redis_url
    redis = RedisStore(url, lp.redis_prefix, lp.redis_timeout_s) if url else None
    metrics = state.metrics
    limits = Limits(
        redis,
        prompt_tokens=prompt_tokens,
        fail_open=lp.on_redis_error == "open",
        key_limits=state.keys.store.all_limits,
        on_backend_error=lambda action: metrics.limits_backend_errors.labels(action).inc(),
    )
    state.pipeline.limits = limits
    limits.refresh_key_limits()
    if redis is None and os.environ.get("PROMETHEUS_MULTIPROC_DIR") and limits.configured(policy):
        log.warning(
            "budgets are kept per worker process without Redis: with --workers N each worker "
            "may spend a whole budget; set SWITCHYARD_REDIS_URL (or limits.redis_url)"
        )
    ledger_url = state.settings.ledger_url

    def spent(scope: str, since_ts: float) -> dict[str, Decimal]:
        try:
            return query.spent_since(ledger_url, scope, since_ts)
        except Exception:
            log.exception("could not read spend from the ledger to seed the budgets")
            return {}

    started = time.perf_counter()
    await limits.seed(policy, spent)
    log.debug("budgets seeded in %.1f ms", (time.perf_counter() - started) * 1000)
    endpoint = os.environ.get("SWITCHYARD_OTLP_ENDPOINT") or policy.telemetry.otlp_endpoint
    if endpoint:
        state.pipeline.tracer = build_tracer(endpoint, policy.telemetry.service_name)


async def stop(state: AppState) -> None:
    tracer: RequestTracer | None = state.pipeline.tracer
    if tracer is not None:
        tracer.shutdown()


async def export_metrics(state: AppState) -> None:
    """Refresh ``switchyard_budget_remaining_usd`` (called when /metrics is scraped)."""
    for row in await state.pipeline.limits.status(state.pipeline.runtime.policy):
        gauge = state.metrics.budget_remaining.labels(row["scope"], row["name"], row["period"])
        gauge.set(float(row["remaining_usd"]))
