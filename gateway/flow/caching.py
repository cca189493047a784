"""The cache steps of every request: the exact key, the exact and semantic lookups, the
replay of a hit in the client's protocol (its adapter renders it), and the store of a fresh
answer."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.core.ports import SemanticResult
from gateway.core.types import Target
from gateway.flow.adapters.base import Inbound
from gateway.flow.exchange import Exchange
from gateway.flow.metering import durable, record
from gateway.flow.reply import Reply
from gateway.flow.services import Services
from gateway.ledger.meter import estimate_usage
from gateway.routing.plan import RoutePlan

log = logging.getLogger("switchyard")


# A stored answer starts with who produced it, so a hit can say so (x-switchyard-model and
# -provider): NUL, a JSON array [model, provider], a newline, then the answer's JSON. Entries
# written before this envelope are plain JSON and replay without the two headers.
_ORIGIN = b"\x00"


def wrap(payload: bytes, target: Target | None) -> bytes:
    """The cache value of an answer ``target`` produced."""
    if target is None:
        return payload
    return _ORIGIN + orjson.dumps([target.model, target.provider]) + b"\n" + payload


def unwrap(stored: bytes, ex: Exchange | None) -> bytes:
    """The answer's JSON out of a cache value; the model and provider that produced it go on
    ``ex.origin``. Plain JSON (an older entry) comes back as it is."""
    if not stored.startswith(_ORIGIN):
        return stored
    head, _, payload = stored.partition(b"\n")
    try:
        model, provider = orjson.loads(head[1:])
        if ex is not None:
            ex.origin = (str(model), str(provider))
    except (orjson.JSONDecodeError, ValueError, TypeError):
        log.warning("cache entry with an unreadable origin; replayed without it")
    return payload


def cache_key(svc: Services, plan: RoutePlan, inbound: Inbound, ex: Exchange) -> str | None:
    """The exact-cache key of a request (None: the route does not cache it): over the tenant,
    the route, the shape of the answers it stores and the whole request its adapter keys on."""
    mode = plan.policy.cache.mode
    body = inbound.record.body
    if (
        mode == "off"
        or (mode == "deterministic" and not is_deterministic(body))
        or not inbound.cacheable(plan)
    ):
        ex.cache = "off"
        return None
    key = canonical_key(ex.principal.tenant, plan.name, inbound.answers, inbound.keyed())
    if ex.no_cache:
        ex.cache = "bypass"
        svc.metrics.cache.labels("bypass").inc()
        return key  # looked up never, refreshed after the call
    ex.cache = "miss"
    return key


async def cache_get(svc: Services, key: str, ex: Exchange | None = None) -> bytes | None:
    """The cached answer's JSON (its origin goes on ``ex``), or None on a miss."""
    value = await svc.cache.get(key)
    svc.metrics.cache.labels("hit" if value is not None else "miss").inc()
    if value is None:
        return None
    return unwrap(value, ex)


async def semantic_get(
    svc: Services, plan: RoutePlan, body: dict[str, Any], ex: Exchange, answers: str = "chat"
) -> SemanticResult | None:
    """After an exact miss, on routes with ``semantic_cache.enabled``: embed once, look up
    among the entries whose answers have the same shape (``answers``: "chat", "messages").
    Any failure (model, Redis) is a miss, never a failed request."""
    if not plan.policy.semantic_cache.enabled:
        return None
    try:
        sem = await svc.semantic.lookup(svc.policy, plan.name, ex.principal.tenant, body, answers)
    except Exception:
        log.exception("semantic cache lookup failed; served as a miss")
        svc.metrics.cache.labels("semantic_miss").inc()
        return None
    if sem is None:
        return None
    ex.semantic, ex.embedding = sem, sem.vector
    svc.metrics.semantic_lookup.labels(plan.name).observe(sem.seconds)
    svc.metrics.cache.labels("semantic_hit" if sem.lookup.hit else "semantic_miss").inc()
    return sem


def store(svc: Services, plan: RoutePlan, ex: Exchange, key: str, payload: bytes) -> None:
    """Store a fresh answer: the exact cache at once (in-process) or in the background (Redis),
    the semantic cache (when this request looked it up and missed) in place."""
    ttl = plan.policy.cache.ttl_s or svc.policy.cache.ttl_s
    payload = wrap(payload, ex.target)
    if not svc.cache.set_nowait(key, payload, ttl):
        svc.tasks.spawn(svc.cache.set(key, payload, ttl))
    if ex.semantic is not None and not ex.semantic.lookup.hit:
        sem_ttl = plan.policy.semantic_cache.ttl_s or ttl
        try:
            svc.semantic.store(ex.semantic, payload, sem_ttl)
        except Exception:
            log.exception("semantic cache store failed")


async def replay(svc: Services, inbound: Inbound, hit: bytes, ex: Exchange, status: str) -> Reply:
    """A cached answer (exact or semantic hit) in the client's protocol, metered at cost 0;
    the row committed before the client sees the end."""
    ex.cache = status
    hit = unwrap(hit, ex)
    cached = orjson.loads(hit)
    usage = inbound.cached_usage(cached)
    if usage is None or usage.input_tokens is None:  # first metered by estimate: again, for the baseline
        baseline = ex.plan.baseline if ex.plan else None
        model = baseline.upstream_model if baseline is not None else inbound.record.model
        usage = estimate_usage(inbound.record.body, cached, model, usage)
    ex.usage, ex.target = usage, None
    record(svc, ex)
    return await durable(ex, await inbound.replay(cached, hit, ex))
