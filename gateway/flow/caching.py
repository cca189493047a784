"""The cache steps of a chat request: the exact key, the exact and semantic lookups, the
replay of a hit in the client's shape, and the store of a fresh answer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.cache.keys import canonical_key, is_deterministic
from gateway.cache.replay import completion_to_chunks
from gateway.core.ports import SemanticResult
from gateway.core.types import ChatRequest, Target
from gateway.core.types import usage_from_openai as read_usage
from gateway.flow.exchange import Exchange
from gateway.flow.metering import record
from gateway.flow.reply import DONE, Reply, headers, sse
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


def cache_key(svc: Services, plan: RoutePlan, body: dict[str, Any], ex: Exchange) -> str | None:
    mode = plan.policy.cache.mode
    if mode == "off" or (mode == "deterministic" and not is_deterministic(body)):
        ex.cache = "off"
        return None
    key = canonical_key(ex.principal.tenant, plan.name, "chat", body)
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
    svc: Services, plan: RoutePlan, body: dict[str, Any], ex: Exchange, protocol: str = "chat"
) -> SemanticResult | None:
    """After an exact miss, on routes with ``semantic_cache.enabled``: embed once, look up
    among the entries of the same ``protocol`` ("chat", "messages": their answers differ in
    shape). Any failure (model, Redis) is a miss, never a failed request."""
    if not plan.policy.semantic_cache.enabled:
        return None
    try:
        sem = await svc.semantic.lookup(svc.policy, plan.name, ex.principal.tenant, body, protocol)
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


def replay(svc: Services, hit: bytes, req: ChatRequest, ex: Exchange, status: str) -> Reply:
    ex.cache = status
    hit = unwrap(hit, ex)
    completion = orjson.loads(hit)
    usage = read_usage(completion.get("usage"))
    if usage is None or usage.input_tokens is None:  # first metered by estimate: again, for the baseline
        baseline = ex.plan.baseline if ex.plan else None
        model = baseline.upstream_model if baseline is not None else req.model
        usage = estimate_usage(req.body, completion, model, usage)
    ex.usage, ex.target = usage, None
    record(svc, ex)
    if not req.stream:
        return Reply(headers(ex), body=hit)
    chunks = completion_to_chunks(completion, req.include_usage)

    async def frames() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield sse(chunk)
        yield DONE

    return Reply(headers(ex), stream=frames())


def cacheable(body: dict[str, Any]) -> bool:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(c.get("finish_reason") in ("stop", "tool_calls", "length") for c in choices)
