"""The FastAPI application factory and its lifespan (everything is built here, nothing at import)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from fastapi import FastAPI

from gateway import __version__
from gateway.api import admin, dashboard
from gateway.api.errors import install_error_handlers
from gateway.api.fastpath import FastPath
from gateway.api.overload import AdmissionGate
from gateway.api.routes import HOT_ROUTES, router
from gateway.api.state import AppState
from gateway.cache.semantic_layer import SemanticLayer
from gateway.config.loader import load_policy
from gateway.config.settings import Settings
from gateway.ledger.open import open_ledger
from gateway.limits.keys import KeyCache
from gateway.limits.stores import open_key_store
from gateway.pipeline import Pipeline
from gateway.runtime import build_runtime, close_parts
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("switchyard")


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


def create_app(settings: Settings | None = None) -> AdmissionGate:
    settings = settings or Settings.from_env()
    _configure_logging(settings.log_level)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        policy = load_policy(settings.policy_path)  # a bad policy stops start-up with its errors
        metrics = Metrics()
        runtime, _ = build_runtime(policy, None, settings.redis_url, metrics.count_cache_error)
        settings.home.mkdir(parents=True, exist_ok=True)
        ledger = open_ledger(settings.ledger_url, home=settings.home)  # postgresql://: outbox in home
        ledger.start()
        key_store = open_key_store(settings)  # PostgreSQL ledger: keys shared there
        state = AppState(
            settings=settings,
            pipeline=Pipeline(runtime, ledger, metrics),
            keys=KeyCache(key_store),
            ledger=ledger,
            metrics=metrics,
        )
        state.redact_with_current_secrets()
        app.state.sy = state
        state.pipeline.semantic = SemanticLayer(
            settings.redis_url, home=settings.home, on_redis_error=metrics.count_cache_error
        )
        state.spawn(state.pipeline.semantic.warm(policy))  # loads the embedder only if a route uses it
        await admin.start(app, state)  # limits (Redis), budget seeding, tracing
        loop = asyncio.get_running_loop()
        sighup = False
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, lambda: state.spawn(state.reload()))
            sighup = True
        if settings.policy_watch_s > 0:
            state.spawn(state.watch_policy(settings.policy_watch_s))
        state.spawn(runtime.engines.run(metrics.record_engine))  # engine /metrics probe (idle if none)
        log.info(
            "switchyard %s ready: policy %s, ledger %s",
            __version__,
            settings.policy_path,
            settings.ledger_url,
        )
        try:
            yield
        finally:
            if sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            await state.pipeline.aclose()
            await admin.stop(state)
            for task in list(state.tasks):
                task.cancel()
            await asyncio.gather(*state.tasks, return_exceptions=True)  # let them clean up
            await close_parts([*state.pipeline.runtime.providers.values(), state.pipeline.runtime.cache])
            await asyncio.to_thread(ledger.close)
            key_store.close()

    app = FastAPI(
        title="Switchyard",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(admin.router)
    app.include_router(dashboard.router)
    return AdmissionGate(FastPath(app, HOT_ROUTES if settings.fastpath else {}), app)
