"""`switchyard serve | policy check | keys ... | spend`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gateway import __version__, cli_admin, cli_router, cli_semcache
from gateway.config.loader import PolicyError, load_policy
from gateway.config.settings import Settings
from gateway.core.errors import SwitchyardError
from gateway.core.types import Principal
from gateway.routing.params import apply_params
from gateway.routing.router import Router


def cmd_serve(args: argparse.Namespace) -> int:
    if args.policy:
        os.environ["SWITCHYARD_POLICY"] = str(Path(args.policy).resolve())
    os.environ["SWITCHYARD_LOG_LEVEL"] = args.log_level
    settings = Settings.from_env()
    try:
        load_policy(settings.policy_path)
    except PolicyError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Workers are separate processes: their metrics are merged through files.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="switchyard-metrics-")
    import uvicorn

    uvicorn.run(
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
    return 0


def cmd_policy_check(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        policy = load_policy(path)
    except PolicyError as exc:
        if args.json:
            problems = [{"path": p, "message": m} for p, m in exc.problems]
            print(json.dumps({"ok": False, "file": str(path), "problems": problems}))
        else:
            print(exc.render(), file=sys.stderr)
        return 1
    unconfigured = sorted(n for n, p in policy.providers.items() if not p.configured)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": True,
                    "file": str(path),
                    "routes": sorted(policy.routes),
                    "models": sorted(policy.models),
                    "providers_without_key": unconfigured,
                }
            )
        )
    else:
        n_routes, n_models, n_providers = len(policy.routes), len(policy.models), len(policy.providers)
        counts = f"{n_routes} routes, {n_models} models, {n_providers} providers"
        print(f"{path}: ok ({counts})")
        if unconfigured:
            print(f"  note: providers without an API key (skipped when routing): {', '.join(unconfigured)}")
    return 0


def cmd_policy_simulate(args: argparse.Namespace) -> int:
    """Show how a policy would route one request: targets in fallback order, what is skipped,
    the parameters the route applies, and its cache, retry and timeout settings."""
    try:
        policy = load_policy(Path(args.file))
        principal = Principal(args.tenant, None, policy.allowed_models(args.tenant))
        plan = Router(policy).plan(args.model, principal, args.kind)
    except PolicyError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except SwitchyardError as exc:
        print(f"{exc.status} {exc.code or exc.type}: {exc.message}", file=sys.stderr)
        return 1
    try:
        body = json.loads(args.body) if args.body else {}
    except json.JSONDecodeError as exc:
        print(f"--body is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(body, dict):
        print("--body must be a JSON object", file=sys.stderr)
        return 2
    route = plan.policy
    result = {
        "model": args.model,
        "tenant": args.tenant,
        "route": plan.name if plan.is_route else None,
        "targets": [
            {"model": t.model, "provider": t.provider, "upstream_model": t.upstream_model}
            for t in plan.targets
        ],
        "skipped_providers_without_key": list(plan.unconfigured),
        "baseline": plan.baseline.model if plan.baseline else None,
        "params_sent": {
            k: v for k, v in apply_params(body, route.params).items() if k not in ("model", "messages")
        },
        "cache_mode": route.cache.mode,
        "retries_per_target": route.retries,
        "attempt_timeout_s": route.attempt_timeout_s,
        "deadline_s": route.deadline_s,
    }
    if plan.auto is not None:  # complexity routing: the order for each decision
        result["classifier"] = {
            "threshold": round(plan.auto.threshold, 6),
            "strong": [t.model for t in plan.auto.strong_first.targets],
            plan.auto.low_tier: [t.model for t in plan.auto.low_first.targets],
        }
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        if key == "targets":
            print("targets (fallback order):")
            for i, t in enumerate(plan.targets, 1):
                print(f"  {i}. {t.model} via {t.provider} (upstream model {t.upstream_model})")
        else:
            print(f"{key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="Cost-aware LLM gateway")
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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

    policy = sub.add_parser("policy", help="policy tools")
    psub = policy.add_subparsers(dest="policy_command", metavar="{check,simulate}")
    check = psub.add_parser("check", help="validate a policy file; print every error with its YAML path")
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=cmd_policy_check)
    simulate = psub.add_parser("simulate", help="show how a request for MODEL would be routed")
    simulate.add_argument("file")
    simulate.add_argument("--model", required=True, help="route or catalog model the client sends")
    simulate.add_argument("--tenant", default="default", help="tenant making the request")
    simulate.add_argument("--kind", default="chat", choices=["chat", "completions", "embeddings"])
    simulate.add_argument(
        "--body", default=None, help="request parameters as JSON, e.g. '{\"temperature\": 2}'"
    )
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.set_defaults(func=cmd_policy_simulate)

    def policy_help(_args: argparse.Namespace) -> int:
        policy.print_help()
        return 2

    policy.set_defaults(func=policy_help)

    cli_admin.register(sub)
    cli_router.register(sub)  # `train router`, `router score`
    cli_semcache.register_train(sub)  # `train semcache` (after `train router`: same group)
    from engine.cli import register as register_engine  # the engine tooling; lazy: `engine` only here

    register_engine(sub)

    evaluation = sub.add_parser("eval", help="evaluate the semantic cache or the router on labelled data")
    esub = evaluation.add_subparsers(dest="eval_command", metavar="{semcache,router}")
    # Each feature module registers its own `eval` subcommand on `esub` (one line each below).
    cli_router.register_eval(esub)  # `eval router`
    cli_semcache.register_eval(esub)  # `eval semcache`

    def eval_help(_args: argparse.Namespace) -> int:
        evaluation.print_help()
        return 2

    evaluation.set_defaults(func=eval_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result: int = func(args)
    return result


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
