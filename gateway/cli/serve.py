"""`switchyard serve`: check the policy, then run the gateway under uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from gateway.config.loader import PolicyError, load_policy
from gateway.config.settings import Settings, export_serve_environment


def cmd_serve(args: argparse.Namespace) -> int:
    # uvicorn's workers are fresh processes: they read their settings from the environment.
    export_serve_environment(args.policy, args.log_level, args.workers)
    settings = Settings.from_env()  # a misspelled SWITCHYARD_* variable stops here (exit 2)
    try:
        load_policy(settings.policy_path)
    except PolicyError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    return _run_uvicorn(
        "gateway.api.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        server_header=False,
        proxy_headers=False,
    )


def _run_uvicorn(app: str, **options: Any) -> int:
    """``uvicorn.run``, with one exit code for a start-up failure however many workers: one
    worker exits 3 itself (uvicorn's, or ``api.starting``'s for a late failure); with several,
    uvicorn's supervisor stops the others when one exits 3 but returns as from a clean stop,
    so the code is read off the workers it kept here."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    if options.get("workers", 1) <= 1:
        uvicorn.run(app, **options)  # exits 3 itself on a start-up failure
        return 0
    config = uvicorn.Config(app, **options)
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    with contextlib.suppress(KeyboardInterrupt):
        supervisor.run()
    failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    return STARTUP_FAILURE if failed else 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    serve = sub.add_parser("serve", help="run the gateway (OpenAI-compatible HTTP server)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    serve.add_argument(
        "--policy", default=None, help="policy YAML (default: $SWITCHYARD_POLICY or policies/default.yaml)"
    )
    serve.add_argument("--workers", type=int, default=1, help="worker processes (one per core)")
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds to drain on SIGTERM")
    serve.set_defaults(func=cmd_serve)
