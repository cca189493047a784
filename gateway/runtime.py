"""Everything built from one policy: router, providers, exact cache. Swapped atomically on a
hot reload; providers and the cache are reused when their configuration did not change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.cache.exact import ExactCache, MemoryCache, RedisCache
from gateway.config.policy import CachePolicy, Policy, ProviderPolicy
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import Provider
from gateway.providers.openai_compat import OpenAICompatProvider
from gateway.providers.replicated import ReplicatedProvider
from gateway.routing.balancer import ReplicaBalancer
from gateway.routing.engine_load import EngineBoard
from gateway.routing.router import Router

log = logging.getLogger("switchyard")


@dataclass(frozen=True, slots=True)
class Runtime:
    policy: Policy
    router: Router
    providers: dict[str, Provider]
    cache: ExactCache
    secrets: tuple[str, ...] = field(repr=False)  # provider keys, for redaction
    engines: EngineBoard = field(default_factory=EngineBoard)  # engine load probe state


def _provider_key(p: ProviderPolicy) -> tuple[object, ...]:
    return (p.type, p.base_url, p.api_key, tuple(sorted(p.headers.items())), *_engine_key(p))


def _engine_key(p: ProviderPolicy) -> tuple[object, ...]:
    return (tuple(p.replicas), p.balance, p.affinity) if p.replicas else ()


def _make_engine(name: str, p: ProviderPolicy, engines: EngineBoard) -> Provider:
    """An engine with replicas: one OpenAI-compatible client per replica behind a balancer."""
    balancer = ReplicaBalancer(
        p.replicas,
        p.balance,
        prefix_chars=p.affinity.prefix_chars,
        load_factor=p.affinity.load_factor,
        available=lambda url: engines.replica_available(name, url),
    )
    clients = [OpenAICompatProvider(name, url, p.api_key, p.headers) for url in p.replicas]
    return ReplicatedProvider(name, clients, balancer)


def _make_provider(name: str, p: ProviderPolicy, engines: EngineBoard | None = None) -> Provider:
    if p.replicas and engines is not None:
        return _make_engine(name, p, engines)
    if p.type == "anthropic":
        return AnthropicProvider(name, p.base_url, p.api_key, p.headers)
    return OpenAICompatProvider(name, p.base_url, p.api_key, p.headers)


def _make_cache(c: CachePolicy, redis_url: str | None, on_error: Callable[[], None] | None) -> ExactCache:
    """Redis when SWITCHYARD_REDIS_URL is set (deployments share one Redis across replicas)
    or when the policy asks for it; otherwise the in-process LRU."""
    url = redis_url or (c.redis_url if c.backend == "redis" else None)
    if url:
        return RedisCache(url, c.redis_timeout_s, c.max_entry_bytes, on_error=on_error)
    return MemoryCache(c.max_bytes, c.max_entry_bytes)


def build_runtime(
    policy: Policy,
    previous: Runtime | None,
    redis_url: str | None,
    on_cache_error: Callable[[], None] | None = None,
) -> tuple[Runtime, list[object]]:
    """A runtime for ``policy``, plus the old parts no longer used (to close after a grace)."""
    providers: dict[str, Provider] = {}
    retired: list[object] = []
    engines = previous.engines if previous is not None else EngineBoard()
    engines.configure(policy)
    old_keys = (
        {n: _provider_key(previous.policy.providers[n]) for n in previous.providers} if previous else {}
    )
    for name, cfg in policy.providers.items():
        if previous is not None and old_keys.get(name) == _provider_key(cfg):
            providers[name] = previous.providers[name]
        else:
            providers[name] = _make_provider(name, cfg, engines)
    if previous is not None:
        retired += [p for n, p in previous.providers.items() if providers.get(n) is not p]
    if previous is not None and previous.policy.cache == policy.cache:
        cache = previous.cache
    else:
        cache = _make_cache(policy.cache, redis_url, on_cache_error)
        if previous is not None:
            retired.append(previous.cache)
    unconfigured = [n for n, p in policy.providers.items() if not p.configured]
    if unconfigured:
        log.warning("providers without an API key are skipped by the router: %s", ", ".join(unconfigured))
    secrets = tuple(p.api_key for p in policy.providers.values() if p.api_key)
    return Runtime(policy, Router(policy), providers, cache, secrets, engines), retired


async def close_later(parts: list[object], delay: float) -> None:
    """Close retired providers/caches once in-flight requests had time to finish (at once
    when the gateway shuts down first and cancels this task)."""
    try:
        await asyncio.sleep(delay)
    finally:
        await close_parts(parts)


async def close_parts(parts: list[object]) -> None:
    for part in parts:
        closer = getattr(part, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except Exception:  # closing must never take the gateway down
                log.exception("closing %s failed", type(part).__name__)
