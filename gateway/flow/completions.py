"""Legacy completions (``POST /v1/completions``): a model of kind ``completions`` (an upstream
that still serves the endpoint) is passed through as it is, JSON only; any other model names
a chat route, served through the chat steps by the completions adapter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.errors import BadRequestError
from gateway.flow import pipeline
from gateway.flow.adapters.completions import Completions
from gateway.flow.exchange import Exchange
from gateway.flow.reply import Reply
from gateway.flow.services import Services


async def create(svc: Services, body: dict[str, Any], headers: Mapping[str, str], ex: Exchange) -> Reply:
    kind = svc.router.kind_of(body.get("model"))
    if kind is not None and kind != "chat":
        if body.get("stream"):
            raise BadRequestError(
                f"The model '{body['model']}' is served by a completions upstream without streaming;"
                " send 'stream': false",
                param="stream",
            )
        return await pipeline.passthrough(svc, "completions", body, ex)
    return await pipeline.serve(svc, Completions(svc, body, headers), ex)
