"""Parse server argument lists with vLLM's own parser (run with the vLLM interpreter).

stdin: JSON {name: [args...]}; stdout: JSON {name: null | "error message"}."""

from __future__ import annotations

import contextlib
import io
import json
import sys


def check(args: list[str]) -> str | None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm-serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
        validate_parsed_serve_args(ns)
        engine_args = AsyncEngineArgs.from_cli_args(ns)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argument error"
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    # values vLLM's parser produced must be the profile's (no silent drop)
    if engine_args.model != ns.model:
        return "model not taken"
    return None


def main() -> None:
    jobs = json.load(sys.stdin)
    print(json.dumps({name: check(args) for name, args in jobs.items()}))


if __name__ == "__main__":
    main()
