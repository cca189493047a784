"""What the HTTP layer keeps for the process: the running gateway (from gateway/bootstrap.py),
the request-id counter and the body-read deadlines. Handlers read ``state.services`` once per
request."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from gateway.api.auth import authenticate
from gateway.api.deadlines import BodyDeadlines
from gateway.api.errors import REQUEST_ID
from gateway.api.seen import LOGGED, TENANT, label
from gateway.bootstrap import Gateway
from gateway.core.errors import SwitchyardError
from gateway.flow import access_log
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services

WANTED = (
    b"authorization", b"x-api-key", b"cache-control", b"content-length",
    b"x-switchyard-task", b"anthropic-version", b"anthropic-beta",
)  # fmt: skip


def wanted_headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """The request headers the API reads, in one pass over the raw ASGI list (names arrive
    lower-cased; the first of repeated ones wins, as in starlette's ``Headers.get``).
    starlette's ``Headers.get`` scans the list and raises and catches a KeyError inside for
    each absent name."""
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in WANTED:
            out.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return out


class AppState:
    __slots__ = ("body_deadlines", "counter", "gateway", "id_prefix")

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.body_deadlines = BodyDeadlines()
        self.id_prefix = os.urandom(6).hex()
        self.counter = 0

    @property
    def services(self) -> Services:
        return self.gateway.services

    def open(self, request: Request, headers: Mapping[str, str], svc: Services) -> Exchange:
        """Stamp the request (id, arrival time), authenticate it, open its ``Exchange``;
        ``headers``: ``wanted_headers``."""
        started = time.perf_counter()
        self.counter += 1
        request_id = f"req_{self.id_prefix}{self.counter:010x}"
        request.scope[REQUEST_ID] = request_id
        try:
            principal = authenticate(headers, svc.policy, svc.keys)
        except SwitchyardError as exc:
            unauthenticated(svc, request, request_id, exc, started)
            raise
        request.scope[TENANT] = principal.tenant
        cc = headers.get("cache-control")
        no_cache = bool(cc and ("no-cache" in cc or "no-store" in cc))
        return Exchange(request_id, principal, started, time.time(), no_cache=no_cache)


def unauthenticated(
    svc: Services, request: Request, request_id: str, exc: SwitchyardError, started: float
) -> None:
    """A request refused before it had a tenant (no key, a wrong key, the key store down): no
    ledger row (it names no tenant), but its metric samples and its access-log line."""
    request.scope[LOGGED] = True
    endpoint = label(request.url.path)
    svc.metrics.rejections.labels(exc.code or exc.type).inc()
    svc.metrics.requests.labels(endpoint, "", "none", "none", "error", "off").inc()
    seconds = time.perf_counter() - started
    access_log.refused(
        request_id, endpoint, exc.status, exc.code, seconds, enabled=svc.policy.server.access_log
    )
