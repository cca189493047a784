"""Canonical cache keys: one hash over everything that can change an answer."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

# Fields that never change the answer: transport and bookkeeping only.
_NOT_IN_KEY = frozenset({"stream", "stream_options", "user", "metadata", "store", "service_tier"})
_FLOAT_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def canonical_key(tenant: str, route: str, endpoint: str, body: dict[str, Any]) -> str:
    """sha256 over (tenant, route, endpoint, the request minus transport fields).

    Keys are sorted recursively; numeric sampling parameters are compared as floats so
    ``temperature: 0`` and ``temperature: 0.0`` share an entry."""
    canon = {k: v for k, v in body.items() if k not in _NOT_IN_KEY}
    for name in _FLOAT_PARAMS:
        value = canon.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            canon[name] = float(value)
    material = orjson.dumps({"t": tenant, "r": route, "e": endpoint, "b": canon}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).hexdigest()


def is_deterministic(body: dict[str, Any]) -> bool:
    """Temperature 0 or a fixed seed: the only requests cached by default."""
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0:
        return True
    return body.get("seed") is not None
