"""`switchyard policy check | simulate`: validate a policy file; show how it routes a request."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.config.loader import PolicyError, load_policy
from gateway.config.policy import Policy
from gateway.config.settings import Settings
from gateway.core.errors import NotConfiguredError, SwitchyardError
from gateway.core.types import Principal
from gateway.routing.params import apply_params
from gateway.routing.plan import AutoRoute, QualityRoute
from gateway.routing.router import Router


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
    keyless: list[str] = []
    try:
        policy = load_policy(Path(args.file))
        principal = Principal(args.tenant, None, policy.allowed_models(args.tenant))
        try:
            plan = Router(policy).plan(args.model, principal, args.kind)
        except NotConfiguredError:  # no provider key here: route as if every provider had one
            keyless = sorted(n for n, p in policy.providers.items() if not p.configured)
            with _silenced(logging.getLogger("switchyard")):  # its warnings were said just above
                plan = Router(_with_keys(policy)).plan(args.model, principal, args.kind)
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
        "simulated_keys_for": keyless,
        "baseline": plan.baseline.model if plan.baseline else None,
        "params_sent": {
            k: v for k, v in apply_params(body, route.params).items() if k not in ("model", "messages")
        },
        "cache_mode": route.cache.mode,
        "retries_per_target": route.retries,
        "attempt_timeout_s": route.attempt_timeout_s,
        "deadline_s": route.deadline_s,
    }
    if isinstance(plan.auto, QualityRoute):  # select: cheapest
        from gateway.cli.router_irt import simulate_quality

        result["classifier"] = simulate_quality(plan.auto, body, args.embedder)
    elif plan.auto is not None:  # complexity routing: the order for each decision
        result["classifier"] = {
            "threshold": round(plan.auto.threshold, 6),
            "strong": [t.model for t in plan.auto.strong_first.targets],
            plan.auto.low_tier: [t.model for t in plan.auto.low_first.targets],
            **_tier_decision(plan.auto, body, args.embedder),
        }
    if plan.policy.learn is not None:  # a learned route: the estimates behind its next choice
        from gateway.cli.learning import simulate_learned

        url = str(args.ledger or Settings.from_env().ledger_url)
        result["learned"] = simulate_learned(plan, policy, args.tenant, args.task, url)
    if keyless:
        note = f"note: no API key for {', '.join(keyless)} here; simulated as if each had one"
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        if key == "targets":
            print("targets (fallback order):")
            for i, t in enumerate(plan.targets, 1):
                print(f"  {i}. {t.model} via {t.provider} (upstream model {t.upstream_model})")
        else:
            print(f"{key}: {_plain(value)}")
    return 0


def _plain(value: object) -> str:
    """A value as a person reads it: none for None, lists comma-separated."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


@contextmanager
def _silenced(logger: logging.Logger) -> Iterator[None]:
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was


def _with_keys(policy: Policy) -> Policy:
    """The policy with every keyless provider taken as configured (a simulation needs no key)."""
    providers = {n: p.model_copy(update={"key_required": False}) for n, p in policy.providers.items()}
    return policy.model_copy(update={"providers": providers})


def _tier_decision(auto: AutoRoute, body: dict[str, Any], backend: str) -> dict[str, Any]:
    """A tiered route with a user message in ``--body``: the classifier's score of it, the
    tier it picks and the order it tries."""
    from gateway.cache.semantic_key import last_user_text

    text = last_user_text(body)
    if not text:
        return {"note": "give --body with a user message to see the classifier's score and choice"}
    from gateway.cache.embedder import load_embedder

    emb = load_embedder(backend)
    auto.classifier.check_embedder(getattr(emb, "space", emb.name), emb.dim)
    score = auto.classifier.score(emb.encode([text])[0], text)
    chosen, tier = auto.decide(score)
    return {"score": round(score, 6), "chosen_tier": tier, "order": [t.model for t in chosen.targets]}


def register(sub: argparse._SubParsersAction[Any]) -> None:
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
    simulate.add_argument("--task", default=None, help="learned routes: the task whose estimates to show")
    simulate.add_argument(
        "--ledger", default=None, help="learned routes: ledger URL (default: SWITCHYARD_LEDGER)"
    )
    simulate.add_argument(
        "--embedder", default="auto", choices=["auto", "onnx", "torch"],
        help="select: cheapest routes with a --body: the backend that embeds the prompt",
    )  # fmt: skip
    simulate.set_defaults(func=cmd_policy_simulate)

    def policy_help(_args: argparse.Namespace) -> int:
        policy.print_help()
        return 2

    policy.set_defaults(func=policy_help)
