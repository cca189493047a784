"""A read or a write on one Redis key that another component's script can carry in its own
round trip: conversation stickiness (routing/sticky_redis.py) rides on the limits' admission
and settlement scripts (limits/redis_store.py), so a conversation request costs Redis no
command of its own when the limits already send one.

The owner builds the request; the carrier fills a ``SharedRead`` (``done``) or reports a
``SharedWrite`` carried; what nothing carried the owner does itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SharedRead:
    """GET ``key`` and push its expiry to ``ttl_ms`` when it exists, in the Redis at ``url``."""

    url: str
    key: str
    ttl_ms: int
    value: str | None = None
    done: bool = False  # a carrier read it: ``value`` is the answer (None: no such key)


@dataclass(frozen=True, slots=True)
class SharedWrite:
    """SET ``key`` to ``value`` with a ``ttl_ms`` expiry, in the Redis at ``url``."""

    url: str
    key: str
    value: str
    ttl_ms: int
