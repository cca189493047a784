"""A route's sampling-parameter rules, applied before caching and routing."""

from __future__ import annotations

from typing import Any

from gateway.config.policy import ParamsPolicy


def apply_params(body: dict[str, Any], params: ParamsPolicy) -> dict[str, Any]:
    """A new body with the route's defaults (when absent), caps and pins applied."""
    if not (params.defaults or params.pinned or params.max or params.min):
        return body
    out = dict(body)
    for name, value in params.defaults.items():
        if out.get(name) is None:
            out[name] = value
    for name, cap in params.max.items():
        value = out.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            out[name] = cap
    for name, floor in params.min.items():
        value = out.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < floor:
            out[name] = floor
    out.update(params.pinned)
    return out
