"""One ledger row (a plain record, no I/O): everything the dollar ledger keeps about one request."""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Final

from gateway.core.record import record

ENDPOINTS: Final = frozenset({"chat", "completions", "embeddings", "messages", "responses"})
CACHE_STATUSES: Final = frozenset({"miss", "hit", "semantic_hit", "bypass", "off"})
STATUSES: Final = frozenset({"ok", "error", "client_disconnected", "stream_broken"})
SAVINGS_CAUSES: Final = frozenset(
    {"exact_cache", "semantic_cache", "self_hosted", "batch", "routing", "none"}
)


def conversation_id(key: str | None) -> str | None:
    """The ledger's name for a conversation: 16 hex digits hashed from its stickiness key
    (``routing.sticky.conversation_key``, itself a hash of tenant, route and what names the
    conversation), so neither a client's text nor its cache key ever reaches the ledger."""
    if not key:
        return None
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


@record
class LedgerRow:
    """A request as the ledger records it. Token counts of None mean "unknown" (never 0);
    money is exact ``Decimal`` USD (None when it could not be priced)."""

    request_id: str
    ts: float  # unix seconds (wall clock) at arrival
    tenant: str
    key_id: str | None  # short non-secret key id, never the key
    route: str | None
    requested_model: str  # what the client sent as ``model``
    served_model: str | None  # catalog model that answered (None: nothing answered)
    provider: str | None
    endpoint: str  # one of ENDPOINTS
    stream: bool
    cache_status: str  # "miss" | "hit" | "bypass" | "off"
    input_tokens: int | None
    cached_tokens: int | None
    cache_write_tokens: int | None
    output_tokens: int | None
    usage_estimated: bool  # counts come from a local tokenizer, not the upstream
    cost_usd: Decimal | None
    baseline_cost_usd: Decimal | None  # what the route's reference model would have cost
    latency_ms: float
    ttft_ms: float | None
    status: str  # "ok" | "error" | "client_disconnected" | "stream_broken"
    http_status: int
    error_code: str | None
    attempts: int
    classifier_score: float | None
    # Why this request cost less than the baseline (one of SAVINGS_CAUSES).
    savings_cause: str = "none"
    route_decision: str | None = None  # the router's choice, e.g. "weak" | "strong" | "spill"
    conversation: str | None = None  # conversation_id(): 16 hex digits, never the client's text
    batch_id: str | None = None  # the batch this request was an item of (docs/batch.md)
    compressed_tokens: int | None = None  # prompt tokens compression saved (None: off on the route)
    task: str | None = None  # RequestRecord.task(): the x-switchyard-task header or ``sys:<hash>``
