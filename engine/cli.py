"""`switchyard engine plan | serve | bench | breakeven`. The gateway's CLI finds ``register``
through the ``switchyard.commands`` entry point (pyproject.toml); neither package imports the
other."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from engine import breakeven as be
from engine import launcher, planner
from engine.profiles import ProfileError, load_profile, shipped_profiles

DEFAULT_PYTHON_ENV = "SWITCHYARD_VLLM_PYTHON"


def _profile(name: str) -> Any:
    try:
        return load_profile(name)
    except ProfileError as exc:
        print(exc.render(), file=sys.stderr)
        return None


def cmd_plan(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if profile is None:
        return 2
    try:
        p = planner.plan(profile, args.gpu, args.avg_len)
    except planner.PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(p.to_json()))
    else:
        print(planner.render(p))
    if not p.fits:
        if args.json:
            print(f"error: {p.problem}", file=sys.stderr)
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if profile is None:
        return 2
    python = args.python or os.environ.get(DEFAULT_PYTHON_ENV) or sys.executable
    cmd = launcher.command(profile, python, args.host, args.port)
    if args.dry_run:
        if args.json:
            print(json.dumps({"command": cmd, "env": profile.env, "gpu_only": profile.gpu_only}))
        else:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in profile.env.items())
            print((env + " " if env else "") + shlex.join(cmd))
        return 0
    return launcher.serve(profile, python, args.host, args.port, args.health_timeout)


def cmd_bench(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if profile is None:
        return 2
    from engine import calibration  # aiohttp: only when benchmarking

    try:
        result = asyncio.run(
            calibration.bench(
                args.url,
                args.model,
                requests=args.requests,
                concurrency=args.concurrency,
                prompt_words=args.prompt_words,
                output_tokens=args.output_tokens,
            )
        )
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        print(f"error: bench against {args.url} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if result.prefill.prompt_tokens == 0 or result.decode.completion_tokens == 0:
        print("error: the engine reported no usage; cannot calibrate", file=sys.stderr)
        return 1
    doc = calibration.calibration(profile, result.prompt_tps, result.generation_tps, result.cached_prompt_tps)
    calibration.write_calibration(Path(args.out), doc)
    print(json.dumps(doc) if args.json else f"wrote {args.out}\n{json.dumps(doc, indent=2)}")
    return 0


def _decimal(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _price(text: str) -> Decimal:
    value = _decimal(text)
    assert value is not None  # a required argument
    return value


def cmd_breakeven(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if profile is None:
        return 2
    prompt_tps, gen_tps = args.prompt_tps, args.gen_tps
    if args.calibration:
        try:
            doc = json.loads(Path(args.calibration).read_text())
            prompt_tps = prompt_tps or float(doc["prompt_tokens_per_s"])
            gen_tps = gen_tps or float(doc["generation_tokens_per_s"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: cannot read calibration {args.calibration}: {exc}", file=sys.stderr)
            return 2
    if not prompt_tps or not gen_tps or prompt_tps <= 0 or gen_tps <= 0:
        print(
            "error: give --calibration FILE (from `engine bench`) or --prompt-tps and --gen-tps",
            file=sys.stderr,
        )
        return 2
    try:
        api = be.ApiPrice(_price(args.api_input), _price(args.api_output), _decimal(args.api_cached_input))
        volumes = [be.parse_volume(v) for v in args.volumes.split(",")]
    except (argparse.ArgumentTypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = be.table(
        volumes,
        usd_per_hour=profile.usd_per_hour,
        prompt_tps=prompt_tps,
        gen_tps=gen_tps,
        api=api,
        output_share=args.output_share,
        cached_share=args.cached_share,
        max_utilization=args.utilization,
    )
    even = be.breakeven_tokens_per_day(
        usd_per_hour=profile.usd_per_hour,
        api=api,
        output_share=args.output_share,
        cached_share=args.cached_share,
    )
    per_token_s = be.gpu_seconds_per_day(1, args.output_share, prompt_tps, gen_tps)
    capacity = int(86_400 * args.utilization / per_token_s)
    if args.json:
        print(
            json.dumps(
                {
                    "profile": profile.name,
                    "gpu_usd_per_hour": str(profile.usd_per_hour),
                    "prompt_tokens_per_s": prompt_tps,
                    "generation_tokens_per_s": gen_tps,
                    "breakeven_tokens_per_day": even,
                    "capacity_tokens_per_day_per_replica": capacity,
                    "rows": [
                        {
                            "tokens_per_day": r.tokens_per_day,
                            "api_usd_per_month": str(r.api_usd_per_month),
                            "self_hosted_usd_per_month": str(r.self_hosted_usd_per_month),
                            "replicas": r.replicas,
                            "utilization": round(r.utilization, 4),
                            "cheaper": r.cheaper,
                        }
                        for r in rows
                    ],
                }
            )
        )
    else:
        print(be.render(rows, even, capacity))
    return 0


def register(sub: Any) -> None:
    """Add `engine ...` to the switchyard CLI's subparsers."""
    eng = sub.add_parser("engine", help="self-hosted vLLM engine: plan, serve, bench, breakeven")
    esub = eng.add_subparsers(dest="engine_command", metavar="{plan,serve,bench,breakeven}")
    names = ", ".join(shipped_profiles())
    prof_help = f"profile YAML file or shipped profile name ({names})"

    p = esub.add_parser(
        "plan", help="capacity plan: weights, KV cache per token/sequence, sequences that fit"
    )
    p.add_argument("profile", help=prof_help)
    p.add_argument(
        "--gpu", default=None, help=f"plan on this GPU kind instead ({', '.join(sorted(planner.GPUS))})"
    )
    p.add_argument(
        "--avg-len", type=int, default=None, help="average tokens per sequence (max_num_seqs advice)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_plan)

    s = esub.add_parser("serve", help="run vLLM's OpenAI server for a profile (waits for /health)")
    s.add_argument("profile", help=prof_help)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--python", default=None, help=f"interpreter with vLLM (default ${DEFAULT_PYTHON_ENV} or this one)"
    )
    s.add_argument("--health-timeout", type=float, default=900.0, help="seconds to wait for /health")
    s.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    s.add_argument("--json", action="store_true", help="with --dry-run: print one JSON object")
    s.set_defaults(func=cmd_serve)

    b = esub.add_parser("bench", help="measure a running engine's throughput and write a price calibration")
    b.add_argument("profile", help=prof_help)
    b.add_argument("--url", required=True, help="the engine's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    b.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    b.add_argument("--out", required=True, help="calibration JSON to write")
    b.add_argument("--requests", type=int, default=32)
    b.add_argument("--concurrency", type=int, default=8, help="requests in flight (the operating point)")
    b.add_argument("--prompt-words", type=int, default=400, help="words per prefill prompt")
    b.add_argument("--output-tokens", type=int, default=128)
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)

    e = esub.add_parser("breakeven", help="monthly self-hosted vs API cost at daily token volumes")
    e.add_argument("profile", help=prof_help)
    e.add_argument("--calibration", default=None, help="calibration JSON from `engine bench`")
    e.add_argument(
        "--prompt-tps", type=float, default=None, help="prompt tokens/s (instead of --calibration)"
    )
    e.add_argument(
        "--gen-tps", type=float, default=None, help="generation tokens/s (instead of --calibration)"
    )
    e.add_argument("--api-input", required=True, help="API price per 1M input tokens, USD")
    e.add_argument("--api-output", required=True, help="API price per 1M output tokens, USD")
    e.add_argument("--api-cached-input", default=None, help="API price per 1M cached input tokens")
    e.add_argument("--volumes", default="100k,1M,10M,100M,1B", help="daily token volumes, comma-separated")
    e.add_argument("--output-share", type=float, default=0.25, help="share of tokens that are output")
    e.add_argument("--cached-share", type=float, default=0.0, help="share of input tokens the API caches")
    e.add_argument("--utilization", type=float, default=0.6, help="planned busy fraction of a replica")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_breakeven)

    def engine_help(_args: argparse.Namespace) -> int:
        eng.print_help()
        return 2

    eng.set_defaults(func=engine_help)
