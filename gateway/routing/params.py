"""A route's sampling-parameter rules, applied before caching and routing.

The rules are written in OpenAI chat names. A same-protocol pass-through applies them to its
wire body under that protocol's names (``names``: chat name -> wire name; a rule whose
parameter the wire format lacks is not applied there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.config.policy import ParamsPolicy

ANTHROPIC_NAMES: Final[Mapping[str, str | None]] = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "seed": None,
    "presence_penalty": None,
    "frequency_penalty": None,
    "n": None,
}
RESPONSES_NAMES: Final[Mapping[str, str | None]] = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "stop": None,
    "seed": None,
    "top_k": None,
    "n": None,
}


def apply_params(
    body: dict[str, Any], params: ParamsPolicy, names: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """A new body with the route's defaults (when absent), caps and pins applied."""
    if not (params.defaults or params.pinned or params.max or params.min):
        return body
    out = dict(body)

    def wire(name: str) -> str | None:
        return name if names is None else names.get(name, name)

    for name, value in params.defaults.items():
        key = wire(name)
        if key is not None and out.get(key) is None:
            out[key] = _wire_value(key, value)
    for name, cap in params.max.items():
        key = wire(name)
        value = out.get(key) if key is not None else None
        if (
            key is not None
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > cap
        ):
            out[key] = cap
    for name, floor in params.min.items():
        key = wire(name)
        value = out.get(key) if key is not None else None
        if (
            key is not None
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value < floor
        ):
            out[key] = floor
    for name, value in params.pinned.items():
        key = wire(name)
        if key is not None:
            out[key] = _wire_value(key, value)
    return out


def _wire_value(key: str, value: Any) -> Any:
    """``stop`` as Anthropic's ``stop_sequences`` is always a list."""
    if key == "stop_sequences" and isinstance(value, str):
        return [value]
    return value
