"""What a gateway answers while it is still starting, or after its start-up failed late.

Most start-ups take milliseconds and finish inside the lifespan, before uvicorn listens. One
that takes longer (a big SQLite ledger migrating its schema or building its spans, another
worker holding the database for that) goes on in the background once ``app.START_GRACE_S``
has passed, so that the process listens and an orchestrator's probes get answers instead of a
refused connection (Kubernetes would restart a pod whose start-up probe times out, rolling
the migration back, forever):

* ``/healthz`` 200 while starting (the process is alive and working), 503 once start-up failed
  (a liveness probe then restarts it);
* ``/readyz`` and ``/metrics`` 503 with what it is doing;
* every other path a 503 ``starting`` with ``Retry-After`` (the SDKs retry it), or
  ``start_failed`` (no details: those are in the log); OpenAI-shaped, Anthropic's shape on
  /v1/messages (``api.errors.error_bytes``).

A start-up that fails late exits the process with code 3, as one failing inside the grace
does (``Settings.exit_on_start_failure``, on under ``switchyard serve`` unless
``SWITCHYARD_EXIT_ON_START_FAILURE=0``); a gateway embedded with that off stays up, failed."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from typing import Protocol

import orjson
from starlette.types import Scope, Send

from gateway import bootstrap
from gateway.api.errors import error_bytes
from gateway.config.settings import Settings
from gateway.core.errors import StartingError
from gateway.flow.services import TaskOwner

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
STARTUP_FAILURE = 3  # uvicorn's exit code for a start-up that failed (its supervisor then stops)
FAILED_MESSAGE = "The gateway failed to start; its log says why"


class StartGate:
    """The answers of a gateway whose start-up is still running (``describe()`` says what it
    is doing) or has failed (``fail()``)."""

    def __init__(self, describe: Callable[[], str]) -> None:
        self.describe = describe
        self.failed = False

    def fail(self) -> None:
        self.failed = True

    async def answer(self, scope: Scope, send: Send) -> None:
        phase = "failed" if self.failed else self.describe()
        path = scope["path"]
        headers = [(b"content-type", b"application/json")]
        if path in ("/healthz", "/readyz", "/metrics"):
            status = 200 if path == "/healthz" and not self.failed else 503
            body = orjson.dumps({"status": "failed" if self.failed else "starting", "phase": phase})
        else:
            status = 503
            if self.failed:
                error = StartingError(FAILED_MESSAGE, code="start_failed")
            else:
                error = StartingError(f"The gateway is starting ({phase}); retry shortly")
                headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
            body = error_bytes(error, path)
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _exit_now(code: int) -> None:
    """End the process at once. Nothing was accepted (every request got a 503) and nothing
    that started holds a request's data, so there is nothing to drain; a SystemExit out of
    the loop would cancel uvicorn's lifespan task instead, which logs two tracebacks."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Gated(Protocol):
    start_gate: StartGate | None


class Start:
    """``bootstrap.start`` for the lifespan: ``begin`` waits up to ``grace_s``; a start-up done
    by then is installed (``on_started``) or raises as before; a slower one goes on while
    ``gated`` answers through a ``StartGate`` until it is installed or has failed."""

    def __init__(
        self, settings: Settings, gated: _Gated, on_started: Callable[[bootstrap.Gateway], None]
    ) -> None:
        self._settings = settings
        self._gated = gated
        self._on_started = on_started
        self._progress = bootstrap.StartProgress()
        self._tasks = TaskOwner()
        self._task: asyncio.Task[bootstrap.Gateway | Exception] | None = None

    async def _attempt(self) -> bootstrap.Gateway | Exception:
        try:  # the failure is returned: the lifespan raises or reports it, TaskOwner logs nothing
            return await bootstrap.start(self._settings, self._progress)
        except Exception as exc:
            return exc

    async def begin(self, grace_s: float) -> None:
        task = self._task = self._tasks.spawn(self._attempt())
        await asyncio.wait({task}, timeout=grace_s)
        if task.done():
            outcome = task.result()
            if isinstance(outcome, Exception):
                raise outcome  # a bad policy or ledger stops start-up with its errors
            self._on_started(outcome)
            return
        gate = self._gated.start_gate = StartGate(self._progress.describe)
        log.warning(
            "start-up is taking a while (%s): /healthz answers, /readyz and requests 503 until done",
            self._progress.describe(),
        )

        def finished(task: asyncio.Task[bootstrap.Gateway | Exception]) -> None:
            if task.cancelled():
                return
            outcome = task.result()
            if isinstance(outcome, Exception):
                gate.fail()
                if self._settings.exit_on_start_failure:
                    log.error("start-up failed; exiting (code %d)", STARTUP_FAILURE, exc_info=outcome)
                    _exit_now(STARTUP_FAILURE)
                log.error("start-up failed; answering 503 until restarted", exc_info=outcome)
                return
            self._gated.start_gate = None
            self._on_started(outcome)

        task.add_done_callback(finished)

    async def end(self) -> bootstrap.Gateway | None:
        """At shutdown: the started gateway (to close), or None (a start-up still running is
        cancelled; a ledger migrating in its thread rolls back when the process exits)."""
        task = self._task
        if task is None:
            return None
        if not task.done():
            await self._tasks.aclose(grace=0)
            return None
        outcome = task.result()
        return None if isinstance(outcome, Exception) else outcome
