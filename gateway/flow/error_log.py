"""Server-side failures in the log: a request that ends in a 5xx (an upstream down or refusing,
a route no configured provider serves, a stream broken mid-way, a bug) leaves a WARNING line,
so an operator running ``switchyard serve`` without an access log sees what fails and where.

One line per kind of failure (status, code, how it ended, route) at most every ``INTERVAL_S``,
saying how many more of that kind came meanwhile: an outage cannot flood the log. The line
names the request id, the route and the target, never a message or a body (an upstream's
error text can echo a prompt); the log's redacting filter still applies."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.flow.exchange import Exchange

log = logging.getLogger("switchyard")

INTERVAL_S = 10.0
_MAX_KINDS = 1024  # kinds are bounded by statuses x codes x routes; a reload may bring new routes

Kind = tuple[int, str | None, str, str]


class ErrorLog:
    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._seen: dict[Kind, tuple[float, int]] = {}  # kind -> (last line's time, held back since)

    def note(self, ex: Exchange) -> None:
        """Log ``ex`` if it ended in a 5xx and its kind was not logged in the last interval."""
        if ex.http_status < 500:
            return
        route = ex.route or "-"
        kind: Kind = (ex.http_status, ex.error_code, ex.status, route)
        now = self._clock()
        last = self._seen.get(kind)
        if last is not None and now - last[0] < self._interval:
            self._seen[kind] = (last[0], last[1] + 1)
            return
        if len(self._seen) >= _MAX_KINDS:
            self._seen.clear()
        self._seen[kind] = (now, 0)
        target = (
            f"{ex.target.model} via {ex.target.provider}" if ex.target is not None else "no upstream called"
        )
        more = f"; {last[1]} more like it since the last such line" if last is not None and last[1] else ""
        log.warning(
            "request %s failed: %d %s (%s) on route %s, %s%s",
            ex.request_id,
            ex.http_status,
            ex.error_code or "-",
            ex.status,
            route,
            target,
            more,
        )


server_errors = ErrorLog()  # the process's one (every Services of a reload shares it)
