"""The built-in, dated price catalog (``prices.json``) and engine cost calibrations.

Every model the policy names gets a price at load time, in this order:

1. ``models.X.price`` in the policy (overrides everything);
2. ``models.X.price_calibration``: the JSON ``switchyard engine bench`` writes for a
   self-hosted model (GPU $/hour over measured throughput);
3. the catalog entry for the model's upstream id (or its name), also with a dated snapshot
   suffix removed (``gpt-4o-2024-08-06`` -> ``gpt-4o``, ``claude-sonnet-4-5-20250929`` ->
   ``claude-sonnet-4-5``). Not for providers marked ``self_hosted``: a public API's price
   says nothing about what our own GPUs cost.

A model with none of these is a policy error: zero is never assumed.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from gateway.config.policy import ModelPolicy, Policy, PricePolicy

_SNAPSHOT: Final = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
_PRICE_FIELDS: Final = ("input", "cached_input", "cache_write", "cache_write_1h", "output", "batch")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    model: str  # the upstream model id the entry is keyed by
    host: str  # who sells it at this price (openai, anthropic, together, groq, ...)
    price: PricePolicy


@dataclass(frozen=True, slots=True)
class Catalog:
    as_of: str  # the date the prices were taken (ISO 8601)
    entries: MappingProxyType[str, CatalogEntry]

    def lookup(self, upstream_id: str) -> CatalogEntry | None:
        """The entry for ``upstream_id``, trying it without a dated snapshot suffix next."""
        entry = self.entries.get(upstream_id)
        if entry is None:
            base = _SNAPSHOT.sub("", upstream_id)
            if base != upstream_id:
                entry = self.entries.get(base)
        return entry


def _decimal(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}: expected a decimal string, got {type(value).__name__}")
    try:
        out = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{where}: {value!r} is not a decimal number") from None
    if not out.is_finite() or out < 0:
        raise ValueError(f"{where}: must be a finite number >= 0")
    return out


def _price(raw: Any, where: str, required: tuple[str, ...] = ("input", "output")) -> PricePolicy:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object")
    missing = [k for k in required if raw.get(k) is None]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    values = {k: _decimal(raw[k], f"{where}.{k}") for k in _PRICE_FIELDS if raw.get(k) is not None}
    return PricePolicy(**values)


def parse_catalog(data: Any) -> Catalog:
    """A ``Catalog`` from the parsed ``prices.json`` structure (ValueError when malformed)."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise ValueError("price catalog: expected an object with 'as_of' and 'models'")
    as_of = data.get("as_of")
    if not isinstance(as_of, str) or not as_of:
        raise ValueError("price catalog: 'as_of' must be a date string")
    entries = {}
    batch = data.get("batch", {})  # host -> the share of list price its batch API charges
    for model, raw in data["models"].items():
        host = str(raw.get("host", ""))
        if host in batch and raw.get("batch") is None:
            raw = {**raw, "batch": batch[host]}
        entries[model] = CatalogEntry(model, host, _price(raw, f"models.{model}"))
    return Catalog(as_of, MappingProxyType(entries))


@functools.cache
def builtin_catalog() -> Catalog:
    """The catalog shipped with Switchyard (read once, on first use; immutable)."""
    text = resources.files("gateway.config").joinpath("prices.json").read_text(encoding="utf-8")
    return parse_catalog(json.loads(text))


def read_calibration(path: Path) -> PricePolicy:
    """The price in an engine cost calibration file. ValueError (with a readable reason) when
    it is missing, not JSON, or has no valid ``price_usd_per_1m``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read calibration file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"calibration file {path} is not UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"{exc.msg} (line {exc.lineno})"
        raise ValueError(f"calibration file {path} is not valid JSON: {why}") from None
    if not isinstance(data, dict):
        raise ValueError(f"calibration file {path}: expected a JSON object")
    if "price_usd_per_1m" not in data:
        raise ValueError(f"calibration file {path}: missing 'price_usd_per_1m'")
    return _price(data["price_usd_per_1m"], f"calibration file {path}: price_usd_per_1m")


def _price_for(
    name: str, model: ModelPolicy, policy: Policy, base_dir: Path, catalog: Catalog
) -> tuple[PricePolicy | None, tuple[str, str] | None]:
    if model.price is not None:
        return model.price, None
    if model.price_calibration is not None:
        path = Path(model.price_calibration).expanduser()
        if not path.is_absolute():
            path = base_dir / path
        try:
            return read_calibration(path), None
        except ValueError as exc:
            return None, (f"models.{name}.price_calibration", str(exc))
    provider = policy.providers.get(model.provider)
    if provider is not None and provider.self_hosted:
        why = (
            f"no price for self-hosted model '{name}': set price or price_calibration "
            "(the output of `switchyard engine bench`)"
        )
        return None, (f"models.{name}.price", why)
    upstream = model.upstream or name
    entry = catalog.lookup(upstream)
    if entry is None and upstream != name:
        entry = catalog.lookup(name)
    if entry is None:
        why = f"no price for '{upstream}': not in the built-in catalog (as of {catalog.as_of}); set price"
        return None, (f"models.{name}.price", why)
    return entry.price, None


def resolve_prices(
    policy: Policy, base_dir: Path | None = None, catalog: Catalog | None = None
) -> tuple[Policy, list[tuple[str, str]]]:
    """``policy`` with every model's ``price`` filled in, and (yaml path, message) for each
    model that has no price. Relative calibration paths are read from ``base_dir`` (the
    policy file's directory; default: the working directory)."""
    catalog = catalog or builtin_catalog()
    base = base_dir or Path.cwd()
    problems: list[tuple[str, str]] = []
    models = dict(policy.models)
    changed = False
    for name, model in policy.models.items():
        if model.price is not None:
            continue
        price, problem = _price_for(name, model, policy, base, catalog)
        if problem is not None:
            problems.append(problem)
        elif price is not None:
            models[name] = model.model_copy(update={"price": price})
            changed = True
    if not changed:
        return policy, problems
    return policy.model_copy(update={"models": models}), problems
