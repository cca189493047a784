"""The Batch API's plain types (no I/O): a batch as the store keeps it, and one claimed item.

A batch belongs to the tenant (and key) that created it; its items run later, each as an
ordinary request of that tenant and key (gateway/flow/batch_runner.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

# OpenAI's statuses; an Anthropic batch shows them as processing_status (see protocols/batches)
OPEN: Final = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ITEM_DONE: Final = frozenset({"succeeded", "errored", "canceled", "expired"})
ITEM_STATUSES: Final = frozenset({"pending", "running", *ITEM_DONE})
ENDPOINTS: Final = {  # the wire path a batch names -> the endpoint its items run on
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


@dataclass(slots=True)
class Batch:
    """One batch: who made it, what it runs, where it stands (``times``: the moments of its
    status changes, unix seconds, by OpenAI's field name, e.g. ``in_progress_at``)."""

    id: str
    tenant: str
    key_id: str | None
    api: str  # "openai" | "anthropic": the protocol its objects and results are shown in
    endpoint: str  # the wire path, e.g. "/v1/chat/completions"
    model: str | None  # the first valid item's model: its route's batch policy picks the lane
    input_file_id: str | None
    completion_window: str
    metadata: dict[str, Any] | None
    status: str
    created_at: float
    expires_at: float
    times: dict[str, float] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None  # per-line problems found when it was created
    upstream: dict[str, Any] | None = None  # lane provider: the provider's batch (flow/batch_forward.py)


class BatchHolds:
    """What the budgets hold for the items of this process's batches not yet run: batch id ->
    item index -> the opaque reservation (core.ports.Limits). Reserved when a batch is created,
    released item by item as each runs (the run reserves for itself) or when the batch is
    cancelled or expires. In memory: after a restart the budgets are seeded again from the
    ledger and each item reserves when it runs."""

    def __init__(self) -> None:
        self.held: dict[str, dict[int, Any]] = {}

    def take(self, batch_id: str, idx: int) -> Any:
        items = self.held.get(batch_id)
        return None if items is None else items.pop(idx, None)

    def take_all(self, batch_id: str) -> list[Any]:
        return list(self.held.pop(batch_id, {}).values())


@dataclass(frozen=True, slots=True)
class NewItem:
    """An input line: a valid one has a ``body``; a bad one is born ``errored`` with its
    ``result`` (the error) already set."""

    idx: int
    custom_id: str | None
    body: bytes | None
    status: str = "pending"
    result: bytes | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """An item taken for a run: ``attempt`` is its claim number (the completion must carry it,
    so a run whose lease another worker took over cannot commit)."""

    batch_id: str
    idx: int
    custom_id: str | None
    body: bytes
    attempt: int
    interrupted: bool = False  # an earlier attempt's upstream call began and never completed


@dataclass(frozen=True, slots=True)
class ItemResult:
    idx: int
    custom_id: str | None
    status: str
    result: bytes | None


def request_id_of(batch_id: str, idx: int) -> str:
    """The ledger's request id of an item: the same on every attempt, so the ledger (unique
    request ids, inserts that skip a duplicate) keeps one row per item whatever happens."""
    return f"{batch_id}-{idx}"


@dataclass(slots=True)
class ItemCall:
    """Set (``BATCH_ITEM``) while a batch item runs in the pipeline. Before its first upstream
    call ``sent`` is awaited once (the batch store records the send), and every upstream call
    carries the idempotency key of (item, target): the same on every attempt and after a
    restart, so an upstream that honours ``Idempotency-Key`` runs the item once."""

    key: str  # request_id_of(batch, idx)
    sent: Callable[[], Awaitable[None]] | None = None

    async def before_send(self) -> None:
        record, self.sent = self.sent, None
        if record is not None:
            await record()


BATCH_ITEM: ContextVar[ItemCall | None] = ContextVar("switchyard_batch_item", default=None)
# The Idempotency-Key header of the upstream call being made (providers/h1.py sends it).
UPSTREAM_IDEMPOTENCY_KEY: ContextVar[str | None] = ContextVar("switchyard_upstream_key", default=None)


def idempotency_key(item_key: str, provider: str, model: str) -> str:
    """The key of one item's call to one target: the item's request id and a digest of the
    target (a fallback or a cascade's second model is another request, with its own key)."""
    digest = hashlib.sha256(f"{provider}\0{model}".encode()).hexdigest()[:12]
    return f"{item_key}-{digest}"
