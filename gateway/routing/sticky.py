"""Conversation stickiness: a conversation keeps the model it started on, so the provider's
prompt cache for its prefix stays warm (an Anthropic or OpenAI cache read costs a tenth of the
input price; a model switch pays the whole prefix again, plus a cache write).

A conversation is named by what the client gives (``prompt_cache_key``, Anthropic
``metadata.user_id``, a Responses ``previous_response_id`` chain) or else by a fingerprint of
its leading messages (system prompt + first user turn), per tenant and route. The router
moves a conversation only when its model is no longer a target of the route, its breaker
is open, or its attempt fails (the fallback then serves and is remembered).

``StickyConversations`` keeps them in this process (a laptop, or replicas without Redis: each
replica learns on its own); with Redis, ``sticky_redis.RedisSticky`` shares them (chosen in
bootstrap)."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from gateway.core.carry import SharedRead, SharedWrite
from gateway.routing.plan import RoutePlan


def conversation_key(tenant: str, route: str, body: dict[str, Any], hint: str | None = None) -> str | None:
    """The conversation a request's chat body belongs to, or None (a one-message request
    without a system prompt or explicit key starts nothing worth keeping). ``hint``: an
    explicit key the wire protocol carries outside the chat body (Anthropic's
    ``metadata.user_id``)."""
    explicit = hint or body.get("prompt_cache_key")
    meta = body.get("metadata")
    if not explicit and isinstance(meta, dict):
        explicit = meta.get("user_id")
    if isinstance(explicit, str) and explicit:
        seed: Any = ["k", explicit]
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        lead = [m for m in messages[:3] if isinstance(m, dict) and m.get("role") != "assistant"][:2]
        system = body.get("system")
        if system is None and len(messages) < 2:
            return None
        seed = ["f", system, lead]
    raw = orjson.dumps([tenant, route, seed], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def prefer(plan: RoutePlan, model: str | None) -> tuple[RoutePlan, bool]:
    """``plan`` with ``model`` (a conversation's) tried first; True when that reordered it."""
    if model is None:
        return plan, False
    first = [t for t in plan.targets if t.model == model]
    if not first or plan.targets[0].model == model:
        return plan, False
    rest = tuple(t for t in plan.targets if t.model != model)
    return replace(plan, targets=(first[0], *rest)), True


class StickyConversations:
    """conversation key -> the catalog model that last served it (an LRU bounded in entries,
    entries forgotten after ``ttl_s`` idle)."""

    def __init__(
        self, max_entries: int = 100_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._models: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._models)

    def model(self, key: str | None) -> str | None:
        """The conversation's model (None: unknown or idle past the TTL)."""
        if key is None:
            return None
        entry = self._models.get(key)
        if entry is None or self._clock() - entry[0] > self.ttl_s:
            return None
        return entry[1]

    def prefer(self, key: str | None, plan: RoutePlan) -> tuple[RoutePlan, bool]:
        """``plan`` with the conversation's model tried first; True when that reordered it."""
        return prefer(plan, self.model(key))

    def peek(self, key: str) -> SharedRead | None:
        return None  # nothing shared: no read for a carrier

    async def recall(self, key: str, peeked: SharedRead | None = None) -> str | None:
        return self.model(key)

    def remember(self, key: str | None, model: str, recalled: str | None = None) -> SharedWrite | None:
        if key is None:
            return None
        self._models[key] = (self._clock(), model)
        self._models.move_to_end(key)
        while len(self._models) > self.max_entries:
            self._models.popitem(last=False)
        return None

    def write(self, put: SharedWrite) -> None:
        return None

    async def aclose(self) -> None:
        return None
