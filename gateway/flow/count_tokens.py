"""``POST /v1/messages/count_tokens``: the route must exist for the caller. When the route's
first target is an Anthropic upstream, the upstream counts (exact); otherwise the gateway's
tokenizer counts the request as a chat upstream would get it, and says it is an estimate."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from gateway.core.errors import SwitchyardError
from gateway.core.ports import MessagesUpstream
from gateway.flow import access_log
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from gateway.ledger.tokens import count_prompt_tokens
from gateway.protocols.anthropic_messages import to_chat

FORWARDED = ("anthropic-version", "anthropic-beta")
COUNT_TIMEOUT_S = 10.0


async def counted(
    svc: Services, body: dict[str, Any], headers: Mapping[str, str], ex: Exchange
) -> tuple[dict[str, int], dict[str, str]]:
    """``count_tokens`` with what every request leaves: a metric sample and an access-log line
    (no ledger row: nothing is bought)."""
    ex.endpoint, ex.requested = "count_tokens", str(body.get("model"))
    try:
        return await count_tokens(svc, body, headers, ex)
    except SwitchyardError as exc:
        ex.status, ex.http_status, ex.error_code = "error", exc.status, exc.code or exc.type
        svc.metrics.rejections.labels(ex.error_code).inc()
        raise
    finally:
        svc.metrics.requests.labels("count_tokens", ex.route, "none", "none", ex.status, "off").inc()
        seconds = time.perf_counter() - ex.started
        access_log.note(ex, None, seconds, enabled=svc.policy.server.access_log)


async def count_tokens(
    svc: Services, body: dict[str, Any], headers: Mapping[str, str], ex: Exchange
) -> tuple[dict[str, int], dict[str, str]]:
    """(the count, the response headers: ``x-switchyard-token-count`` says ``exact`` or
    ``estimate``)."""
    plan = ex.plan = svc.router.plan(body["model"], ex.principal, "chat")
    target = plan.targets[0] if plan.targets else None
    provider = svc.policy.providers.get(target.provider) if target is not None else None
    if target is not None and provider is not None and provider.type == "anthropic" and not provider.replicas:
        upstream = cast(MessagesUpstream, svc.providers[target.provider])
        forwarded = {name: headers[name] for name in FORWARDED if name in headers}
        try:
            counted = await upstream.count_tokens(body, target, COUNT_TIMEOUT_S, forwarded)
        except SwitchyardError:
            counted = None  # the upstream could not count: the local estimate, said so
        if counted is not None:
            return {"input_tokens": counted}, {"x-switchyard-token-count": "exact"}
    model = target.upstream_model if target is not None else str(body["model"])
    chat, _ = to_chat({**body, "max_tokens": 1}, strict=False)  # every block counted
    return {"input_tokens": count_prompt_tokens(chat, model)}, {"x-switchyard-token-count": "estimate"}
