"""The application state built in the lifespan: settings, pipeline, keys, reload."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from gateway.api.auth import authenticate
from gateway.api.errors import REQUEST_ID
from gateway.config.loader import PolicyError, load_policy
from gateway.config.settings import Settings
from gateway.core.types import RequestContext
from gateway.ledger.store import SQLiteLedger
from gateway.limits.keys import KeyCache
from gateway.pipeline import Pipeline
from gateway.runtime import build_runtime, close_later
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.redaction import Redactor, install

log = logging.getLogger("switchyard")

RETIRE_GRACE_S = 120.0


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


WANTED = (b"authorization", b"x-api-key", b"cache-control", b"content-length")


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


@dataclass(slots=True)
class AppState:
    settings: Settings
    pipeline: Pipeline
    keys: KeyCache
    ledger: SQLiteLedger
    metrics: Metrics
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    id_prefix: str = field(default_factory=lambda: os.urandom(6).hex())
    counter: int = 0

    def context(self, request: Request, headers: Mapping[str, str]) -> RequestContext:
        """Authenticate and stamp the request (id, arrival time); ``headers``: ``wanted_headers``."""
        started = time.perf_counter()
        self.counter += 1
        request_id = f"req_{self.id_prefix}{self.counter:010x}"
        request.scope[REQUEST_ID] = request_id
        principal = authenticate(headers, self.pipeline.runtime.policy, self.keys)
        ctx = RequestContext(request_id, principal, started, time.time())
        cc = headers.get("cache-control")
        if cc and ("no-cache" in cc or "no-store" in cc):
            ctx.cache_control_no_cache = True
        return ctx

    def redact_with_current_secrets(self) -> None:
        admin = self.settings.admin_key.get() if self.settings.admin_key else ""
        install(Redactor((*self.pipeline.runtime.secrets, admin)))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a background task owned by the app (cancelled at shutdown)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def watch_policy(self, interval: float) -> None:
        """Reload when the policy file changes (every worker process watches on its own, so
        `--workers N` and Kubernetes ConfigMap updates converge without a signal)."""
        path = self.settings.policy_path
        last = _file_stamp(path)
        while True:
            await asyncio.sleep(interval)
            stamp = _file_stamp(path)
            if stamp != last and stamp is not None:
                last = stamp
                await self.reload()

    async def reload(self) -> list[tuple[str, str]]:
        """Load the policy file again. On any problem keep the running policy and return the
        problems; an empty list means the new policy is live."""
        async with self.reload_lock:
            try:
                policy = await asyncio.to_thread(load_policy, self.settings.policy_path)
                emptied = not (policy.providers or policy.models or policy.routes)
                if emptied and self.pipeline.runtime.policy.routes:
                    # An empty file parses as an empty policy; on a reload it is a file caught
                    # mid-write (or truncated), not a wish to drop every route.
                    raise PolicyError(
                        str(self.settings.policy_path),
                        [("", "the policy file is empty (being written?); it would remove every route")],
                    )
                runtime, retired = build_runtime(
                    policy, self.pipeline.runtime, self.settings.redis_url, self.metrics.count_cache_error
                )
            except PolicyError as exc:
                self.metrics.policy_reloads.labels("error").inc()
                log.warning("policy reload rejected, keeping the running policy:\n%s", exc.render())
                return exc.problems
            self.pipeline.runtime = runtime
            self.pipeline.breakers.configure(policy.breaker.failure_threshold, policy.breaker.open_seconds)
            self.redact_with_current_secrets()
            self.metrics.policy_reloads.labels("ok").inc()
            log.info("policy reloaded from %s", self.settings.policy_path)
            if retired:
                self.spawn(close_later(retired, RETIRE_GRACE_S))
            return []
