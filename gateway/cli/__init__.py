"""`switchyard ...`: the argparse front of the gateway (the console script is ``run``).

    serve                           gateway.cli.serve
    policy check | simulate         gateway.cli.policy
    keys, spend, savings, budgets   gateway.cli.admin
    train router, router score      gateway.cli.router
    train semcache                  gateway.cli.semcache
    models build                    gateway.cli.models
    eval router | semcache          gateway.cli.router, gateway.cli.semcache
    feedback, tasks, eval routing   gateway.cli.learning
    engine ...                      any installed ``switchyard.commands`` entry point
                                    (this distribution's: ``engine = engine.cli:register``)

Every command's ``func`` takes the parsed ``args`` and returns the exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from gateway import __version__
from gateway.cache.model_errors import ModelUnavailable
from gateway.cli import admin, learning, models, policy, router, semcache, serve
from gateway.cli.extras import missing_extra
from gateway.config.settings import SettingsError

COMMANDS_GROUP = "switchyard.commands"  # entry points: ``name = "module:register"``


def register_plugins(sub: argparse._SubParsersAction[Any]) -> None:
    """Let every installed ``switchyard.commands`` entry point add its commands (each is a
    ``register(subparsers)`` callable); one per name, in name order."""
    found = {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}
    for name in sorted(found):
        found[name].load()(sub)


def _help_of(parser: argparse.ArgumentParser) -> Any:
    def show(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return show


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="Cost-aware LLM gateway")
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve.register(sub)
    policy.register(sub)
    admin.register(sub)
    router.register(sub)  # `train router`, `router score`
    semcache.register_train(sub)  # `train semcache` (after `train router`: same group)
    models.register(sub)  # `models build`
    learning.register(sub)  # `feedback import | quality`, `tasks`
    register_plugins(sub)  # `engine ...`

    evaluation = sub.add_parser("eval", help="evaluate the semantic cache or the router on labelled data")
    esub = evaluation.add_subparsers(dest="eval_command", metavar="{semcache,router}")
    # Each feature module registers its own `eval` subcommand on `esub` (one line each below).
    router.register_eval(esub)  # `eval router`
    semcache.register_eval(esub)  # `eval semcache`
    learning.register_eval(esub)  # `eval routing`, `eval routing-stream`
    evaluation.set_defaults(func=_help_of(evaluation))
    return parser


def command_words(args: argparse.Namespace) -> str:
    """The command as typed, without options: ``router score``, ``train semcache``."""
    top = args.command or ""
    sub = getattr(args, f"{top}_command", None)
    return f"{top} {sub}" if isinstance(sub, str) else top


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        result: int = func(args)
    except SettingsError as exc:  # a misspelled or malformed SWITCHYARD_* variable
        print(f"switchyard: error: {exc.message}", file=sys.stderr)
        return 2
    except ModelUnavailable as exc:  # the ml extra's model file is missing: what to install
        print(f"switchyard {command_words(args)}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional extra that is not installed: name it
        line = missing_extra(exc, command_words(args))
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `switchyard spend | head`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout once more at exit
        return 0
    return result


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
