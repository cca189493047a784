"""The one typed record of a request: who asked, what for, where it went, what it cost.

The HTTP layer opens an ``Exchange`` once it knows the caller; the flow fills it in step by
step (plan, reservation, attempts, usage, cache status, decision); metering reads it once to
leave the metrics, the budget settlement, the trace and the ledger row behind. One request
owns one exchange; nothing else is carried in loose dicts."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

from gateway.core.carry import SharedRead, SharedWrite
from gateway.core.ports import Reservation, SemanticResult
from gateway.core.types import Principal, Target, Usage
from gateway.routing.plan import RoutePlan

CACHE_HITS = ("hit", "semantic_hit")  # answered from a cache: cost 0, no upstream


@dataclass(slots=True)
class Exchange:
    # who, and when (set by the HTTP layer)
    request_id: str
    principal: Principal
    started: float  # time.perf_counter() at arrival
    started_wall: float  # time.time() at arrival
    no_cache: bool = False  # Cache-Control: no-cache / no-store: look up nothing, refresh after
    # what (set when the flow starts)
    endpoint: str = "chat"  # "chat" | "completions" | "embeddings"
    requested: str = ""  # the model the client sent
    stream: bool = False
    # the decision
    plan: RoutePlan | None = None
    classifier_score: float | None = None
    route_decision: str | None = None  # the tier the classifier picked
    semantic: SemanticResult | None = None  # the semantic lookup, when the route ran one
    embedding: object = None  # vector of the last user message (shared with the classifier)
    reservation: Reservation | None = None  # what the budgets hold for this request
    conversation: str | None = None  # routing/sticky.py: keeps its model while it serves
    sticky_read: SharedRead | None = None  # its shared model, read by the admission script
    sticky_write: SharedWrite | None = None  # its new model, for the settlement script to write
    task: str | None = None  # RequestRecord.task(), for the ledger row and the learned routes
    cascade: str | None = None  # a cascade route: "accepted" | "escalated" | "declined-stream"
    zero_baseline: bool = False  # an escalated cascade attempt: it saved nothing (baseline 0)
    # the attempts
    target: Target | None = None  # the target answering (or last tried)
    origin: tuple[str, str] | None = None  # a cache hit: (model, provider) that produced it
    attempts: int = 0
    upstream_seconds: float = 0.0
    # the outcome
    usage: Usage = field(default_factory=Usage)
    cache: str = "off"  # "off" | "bypass" | "miss" | "hit" | "semantic_hit"
    status: str = "ok"  # "ok" | "error" | "client_disconnected" | "stream_broken"
    http_status: int = 200
    error_code: str | None = None
    ttft: float | None = None
    compressed_tokens: int | None = None  # prompt tokens the compression step saved (None: off)
    batch_priced: bool = False  # run by the provider's batch API at its batch price (cause "batch")
    # metering
    recorded: bool = False  # metering ran (exactly once per request)
    commit: Awaitable[bool] | None = None  # the ledger row's commit, awaited before the end

    @property
    def cache_hit(self) -> bool:
        return self.cache in CACHE_HITS

    @property
    def route(self) -> str:
        return self.plan.name if self.plan is not None else ""
