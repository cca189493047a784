"""Admin use cases shared by the HTTP admin API (gateway/api/admin.py) and the CLI
(gateway/cli/admin.py): keys, key limits, spend and savings reports. Each raises the error
tree's BadRequestError / NotFoundError for bad input; the callers render it (JSON or exit code)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any, cast

from gateway.core.errors import BadRequestError, NotFoundError
from gateway.flow.services import Services
from gateway.ledger import report
from gateway.limits.keys import KeyLimits, KeyRecord, KeyStoreBase


def create_key(
    store: KeyStoreBase, tenant: str, name: str | None, limits: KeyLimits
) -> tuple[str, KeyRecord]:
    """A new key for ``tenant`` (the secret is returned once), with its limits if any."""
    try:
        key, rec = store.create(tenant, name)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="tenant") from None
    if not limits.empty:
        store.set_limits(rec.key_id, limits, announce=False)  # not handed out yet
    return key, rec


def revoke_key(store: KeyStoreBase, key_id: str) -> None:
    if not store.revoke(key_id):
        raise NotFoundError(f"No active key with id '{key_id}'", code="key_not_found")


def set_key_limits(store: KeyStoreBase, key_id: str, limits: KeyLimits) -> None:
    if not store.set_limits(key_id, limits):
        raise NotFoundError(f"No active key with id '{key_id}'", code="key_not_found")


def list_keys(store: KeyStoreBase, include_revoked: bool) -> list[tuple[KeyRecord, KeyLimits]]:
    limits = store.all_limits()
    return [(r, limits.get(r.key_id, KeyLimits())) for r in store.list(include_revoked=include_revoked)]


def since(text: str) -> float | None:
    """A report window ("90s", "30m", "24h", "7d" or "all") as seconds back from now (None:
    everything; a window longer than the epoch is everything too, see ``report._window``)."""
    if text == "all":
        return None
    try:
        return report.parse_since(text)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="since") from None


MAX_TOP = 1000  # groups a report may ask for (``limit``)


def top(text: str | None) -> int | None:
    """A report's ``limit`` (the most expensive N groups; conversations default to 20)."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadRequestError(f"limit must be a whole number, not {text!r}", param="limit") from None
    if not 1 <= value <= MAX_TOP:
        raise BadRequestError(f"limit must be between 1 and {MAX_TOP}", param="limit")
    return value


def spend(
    ledger_url: str, group: str, bucket: str, start: float | None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Spend per group and time bucket (blocking: call it off the event loop); the ``limit``
    most expensive conversations for ``group='conversation'``."""
    try:
        return report.spend_series(ledger_url, group, bucket, start, top=limit)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


def quality(
    ledger_url: str, group: str, start: float | None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Requests, spend and feedback quality per group (model, route, task, ...): the mean score
    of the requests rated through /v1/feedback or ``switchyard feedback import`` (blocking)."""
    if group not in report.GROUP_BY_CHOICES:
        choices = ", ".join(report.GROUP_BY_CHOICES)
        raise BadRequestError(f"bad group {group!r}: expected one of {choices}", param="group_by")
    lines = report.spend(ledger_url, cast(report.GroupBy, group), start, top=limit)
    return [
        {
            "group": ln.key,
            "requests": ln.requests,
            "rated": ln.rated,
            "quality": None if ln.quality is None else round(ln.quality, 4),
            "cost_usd": ln.cost_usd,
        }
        for ln in lines
    ]


def savings(ledger_url: str, bucket: str, start: float | None) -> list[dict[str, Any]]:
    """Savings by cause (blocking: call it off the event loop)."""
    try:
        return report.savings_by_cause(ledger_url, bucket, start)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="bucket") from None


def csv_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Report rows as CSV, money written out in full (never ``1E-10``); ``columns``: the
    header, also of an empty report (``report.SERIES_COLUMNS``...)."""
    return report.to_csv(
        [{k: (f"{v:f}" if isinstance(v, Decimal) else v) for k, v in r.items()} for r in rows], columns
    )


SPEND_COLUMNS = report.SERIES_COLUMNS
SAVINGS_COLUMNS = report.SAVINGS_COLUMNS
QUALITY_COLUMNS = ("group", "requests", "rated", "quality", "cost_usd")


def key_json(rec: KeyRecord, limits: KeyLimits | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key_id": rec.key_id,
        "tenant": rec.tenant,
        "name": rec.name,
        "created_at": rec.created_at,
        "revoked_at": rec.revoked_at,
    }
    if limits is not None:
        out["limits"] = limits_json(limits)
    return out


def limits_json(kl: KeyLimits) -> dict[str, Decimal | int | None]:
    return {"rpm": kl.rpm, "tpm": kl.tpm, "daily_usd": kl.daily_usd, "monthly_usd": kl.monthly_usd}


async def export_budget_gauges(svc: Services) -> None:
    """Refresh ``switchyard_budget_remaining_usd`` (called when /metrics is scraped)."""
    for row in await svc.limits.status(svc.policy):
        gauge = svc.metrics.budget_remaining.labels(row["scope"], row["name"], row["period"])
        gauge.set(float(row["remaining_usd"]))
