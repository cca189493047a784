"""`switchyard models build`: make the embedder's int8 ONNX export once (needs the train
extra: torch, onnx and the packaged MiniLM), into the model folder the gateway reads
(``--model-dir``, else ``$SWITCHYARD_MODEL_DIR``, else ``<home>/models``). A gateway with only
the ml extra then runs this export (the recipe the verifier is calibrated on) instead of the
packaged weight-only file."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import time
from pathlib import Path
from typing import Any

from gateway.config.settings import default_home


def build(args: argparse.Namespace) -> int:
    backends: Any = importlib.import_module("gateway.cache.embed_backends")
    home = Path(args.home) if args.home else default_home()
    target: Path = backends.onnx_path(home, Path(args.model_dir) if args.model_dir else None)
    if target.exists() and not args.force:
        print(f"already built: {target} (--force to build it again)")
        return 0
    if not backends.can_export():
        missing = [m for m in backends.EXPORT_MODULES if importlib.util.find_spec(m) is None]
        print(
            f"switchyard models build: needs the train extra (missing {', '.join(missing)}): "
            "pip install 'switchyard[train]'",
        )
        return 2
    started = time.perf_counter()
    backends.export_onnx(target)
    size = target.stat().st_size / 1e6
    print(f"built {target} ({size:.1f} MB) in {time.perf_counter() - started:.1f} s")
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    models = sub.add_parser("models", help="the embedder's int8 ONNX model")
    msub = models.add_subparsers(dest="models_command", metavar="{build}")
    p = msub.add_parser("build", help="export the int8 ONNX embedder once (needs the train extra)")
    p.add_argument("--home", help="SWITCHYARD_HOME (default: the environment's)")
    p.add_argument("--model-dir", help="where to write it (default: $SWITCHYARD_MODEL_DIR or <home>/models)")
    p.add_argument("--force", action="store_true", help="build again even if the file exists")
    p.set_defaults(func=build)
    models.set_defaults(func=lambda _args: (models.print_help(), 2)[1])
