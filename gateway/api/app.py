"""The FastAPI application factory and its lifespan: the gateway is built by
gateway/bootstrap.py at start-up (nothing at import) and closed at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from fastapi import FastAPI

from gateway import __version__, bootstrap
from gateway.api import admin, batches, dashboard, feedback, messages, responses
from gateway.api.errors import install_error_handlers
from gateway.api.fastpath import FastPath
from gateway.api.overload import AdmissionGate
from gateway.api.routes import HOT_ROUTES, router
from gateway.api.starting import Start
from gateway.api.state import AppState
from gateway.config.settings import Settings

log = logging.getLogger("switchyard")
START_GRACE_S = 2.0  # a start-up longer than this goes on in the background (api.starting)


def _configure_logging(level: str) -> None:
    """Give the "switchyard" logger a handler in uvicorn's style unless logging is already set
    up (a host application, or pytest, configured the root logger)."""
    logger = logging.getLogger("switchyard")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     [switchyard] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level.upper())
        logger.propagate = False
        access = logging.getLogger("switchyard.access")  # own handler: no redacting scan (flow/access_log.py)
        access_handler = logging.StreamHandler()
        access_handler.setFormatter(handler.formatter)
        access.addHandler(access_handler)
        access.propagate = False


def create_app(settings: Settings | None = None) -> AdmissionGate:
    settings = settings or Settings.from_env()
    _configure_logging(settings.log_level)

    gate: AdmissionGate | None = None  # set below; the lifespan runs after create_app returns

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        admission = gate
        assert admission is not None
        loop = asyncio.get_running_loop()
        sighup = False

        def started(gateway: bootstrap.Gateway) -> None:
            nonlocal sighup
            app.state.sy = AppState(gateway)
            gateway.batch_runner.interactive = lambda: admission.in_flight  # batch items yield to these
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(signal.SIGHUP, lambda: gateway.tasks.spawn(gateway.reload()))
                sighup = True
            log.info(
                "switchyard %s started: policy %s, ledger %s",
                __version__,
                settings.policy_path,
                settings.ledger_url,
            )

        start = Start(settings, admission, started)
        await start.begin(START_GRACE_S)  # a slow start-up goes on while the process listens
        try:
            yield
        finally:
            if sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            gateway = await start.end()
            if gateway is not None:
                await gateway.aclose()

    app = FastAPI(title="Switchyard", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    app.include_router(batches.router)  # before messages: /v1/messages/batches is its own
    app.include_router(messages.router)
    app.include_router(responses.router)
    app.include_router(feedback.router)
    gate = AdmissionGate(
        FastPath(
            app, {**HOT_ROUTES, **messages.HOT_ROUTES, **responses.HOT_ROUTES} if settings.fastpath else {}
        ),
        app,
    )
    return gate
