"""The ports: what the request flow (gateway/flow/) needs from the parts that do I/O.

The flow names these Protocols, never a concrete store; gateway/bootstrap.py builds the real
parts (SQLite/PostgreSQL ledger, Redis or in-process caches, HTTP providers) and tests hand
in-memory fakes through the same doors. The Batch and Files APIs' ports: core/ports_batch.py.

core names nothing of ours outside itself, so a few parameters that are policy objects
(``gateway.config.policy.Policy`` / ``RoutePolicy``) are typed ``PolicyT`` (``Any``), and the
limits' reservation and budget candidate are opaque handles the flow only passes back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from decimal import Decimal
from typing import Any, Protocol

from gateway.core.carry import SharedRead, SharedWrite
from gateway.core.ledger_row import LedgerRow
from gateway.core.types import ChatResult, ChatStream, RawResult, RequestFacts, Target, Usage

PolicyT = Any  # gateway.config.policy.Policy (or RoutePolicy where the name says route_policy)
Reservation = Any  # opaque: what Limits.reserve handed out, given back to settle/release
Candidate = Any  # opaque: Limits.candidate's budget view of one route plan


class TaskHandle(Protocol):
    """A started background task (an ``asyncio.Task``): its starter may cancel and await it."""

    def cancel(self, msg: Any = None) -> bool: ...

    def done(self) -> bool: ...

    def __await__(self) -> Generator[Any, None, Any]: ...


Spawn = Callable[[Coroutine[Any, Any, Any]], TaskHandle]
"""Start a background task under the one task owner (gateway/flow/services.py, TaskOwner)."""


class Provider(Protocol):
    """One upstream API. It receives the OpenAI-shaped request body (``body["model"]`` is what
    the client sent: send ``target.upstream_model``), speaks its vendor's wire format privately
    and returns OpenAI-shaped results. It maps every failure to gateway.core.errors in one place:

    - connect error / refused  -> UpstreamError(retryable=True, code="upstream_connect_error")
    - timeout                  -> UpstreamTimeoutError
    - HTTP 429                 -> UpstreamRateLimitedError(retry_after=<Retry-After seconds>)
    - HTTP 5xx                 -> UpstreamError(upstream_status=..., retryable=True)
    - HTTP 401/403/404         -> UpstreamError(retryable=False)  (config problem: next target)
    - HTTP other 4xx           -> UpstreamRejectedError (client's fault: no retry, no fallback)
    - non-JSON / malformed     -> UpstreamError(retryable=True, code="upstream_bad_response")

    Error messages never contain the provider key or the request's content."""

    name: str

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        """Non-streaming chat completion. ``timeout`` bounds the whole call."""
        ...

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> ChatStream:
        """Open a stream. Returns once the upstream accepted (status 200 and headers within
        ``timeout``); each later chunk must arrive within ``idle_timeout``. The provider always
        asks the upstream for usage, whatever the client asked."""
        ...

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        """Legacy /v1/completions (non-streaming). Providers without it raise
        UpstreamError(retryable=False, code="unsupported")."""
        ...

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        """/v1/embeddings. Providers without it raise UpstreamError(retryable=False, code="unsupported")."""
        ...

    async def aclose(self) -> None:
        """Release connections (called once at shutdown)."""
        ...


class ExactCache(Protocol):
    """Opaque bytes by key. A backend problem is a miss, never a failed request."""

    backend: str  # "memory" | "redis"

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl: float) -> None: ...

    def set_nowait(self, key: str, value: bytes, ttl: float) -> bool:
        """Store at once when the backend needs no I/O (in-process); False: await ``set``."""
        ...

    async def ping(self) -> bool: ...

    def held_bytes(self) -> int | None:
        """Memory the entries hold in this process (None: they live elsewhere, e.g. Redis)."""
        ...

    async def aclose(self) -> None: ...


class Ledger(Protocol):
    """The durable dollar ledger. ``submit`` resolves (True) once the row is committed, or
    (False) once its batch kept failing for the ledger's wait timeout."""

    phase: str  # what ``start`` is doing ("migrating the schema", ...), "started" after it

    def start(self) -> None: ...

    def submit(self, row: LedgerRow) -> Awaitable[bool]: ...

    def flush(self, timeout: float = 5.0) -> bool: ...

    def pending(self) -> int: ...

    def outbox_rows(self) -> int: ...

    def healthy(self) -> bool: ...

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        """USD spent per key/tenant/route name since ``since_ts`` over every row the ledger
        holds (a PostgreSQL ledger includes its outbox). Blocking: call it off the loop."""
        ...

    def close(self, timeout: float = 10.0) -> None: ...


class FeedbackOutcome(Protocol):
    """One (tenant, task, served model)'s feedback over a route: how many scores, their sum."""

    @property
    def tenant(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def n(self) -> int: ...
    @property
    def total(self) -> float: ...


class Feedback(Protocol):
    """Scores on served requests, kept with the ledger (gateway/ledger/feedback.py)."""

    async def submit(
        self, tenant: str, request_id: str, score: float, source: str = "api"
    ) -> FeedbackOwner | None:
        """Store ``score`` for the tenant's request: what the request was (None: no such
        request of that tenant)."""
        ...

    def outcomes(self, route: str) -> Sequence[FeedbackOutcome]:
        """Blocking: call it off the loop."""
        ...

    def requests_per_task(self, route: str) -> dict[tuple[str, str], int]:
        """Blocking: served requests per (tenant, task) of ``route``."""
        ...

    def explored_per_task(self, route: str) -> dict[tuple[str, str], int]:
        """Blocking: of those, the requests that explored."""
        ...

    def call(self, fn: Callable[[], Any]) -> Awaitable[Any]:
        """Run blocking ``fn`` on the store's worker thread."""
        ...

    def close(self) -> None: ...


class FeedbackOwner(Protocol):
    """The ledger facts of a request that received feedback."""

    @property
    def route(self) -> str | None: ...
    @property
    def task(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def decision(self) -> str | None: ...


class SemanticMatch(Protocol):
    """The best cached neighbour of a lookup (``payload`` set only on a hit)."""

    @property
    def hit(self) -> bool: ...

    @property
    def score(self) -> float: ...

    @property
    def payload(self) -> bytes | None: ...


class SemanticResult(Protocol):
    """One semantic lookup: the query vector (shared with the classifier) and the match."""

    @property
    def vector(self) -> Any: ...

    @property
    def lookup(self) -> SemanticMatch: ...

    @property
    def seconds(self) -> float: ...


class Embedder(Protocol):
    async def embed(self, text: str) -> Any: ...


class SemanticLookup(Protocol):
    """Embedder + semantic cache, loaded on first use (or warmed at start-up)."""

    async def lookup(
        self, policy: PolicyT, route: str, tenant: str, body: dict[str, Any], protocol: str = "chat"
    ) -> SemanticResult | None:
        """``protocol`` ("chat", "messages") is part of the entry's context: the answers of two
        protocols never meet."""
        ...

    def store(self, result: Any, payload: bytes, ttl: float) -> None: ...

    async def embedder(self) -> Embedder: ...

    async def warm(self, policy: PolicyT) -> None: ...

    def start_warm(self, policy: PolicyT) -> None:
        """Warm in the background; ``ready`` is False until every route's models are loaded."""
        ...

    @property
    def ready(self) -> bool: ...

    async def aclose(self) -> None: ...


class Limits(Protocol):
    """Rate limits and budgets (in-process, or shared through Redis)."""

    @property
    def shared(self) -> bool:
        """Shared (Redis): ``admit`` given the budget candidates saves a round trip."""
        ...

    async def admit(
        self,
        policy: PolicyT,
        tenant: str,
        key_id: str | None,
        *,
        body: Mapping[str, Any] | None = None,
        candidates: Sequence[Candidate] = (),
        peek: SharedRead | None = None,
    ) -> Reservation | None:
        """Raise RateLimitError (429 with Retry-After) when a rate limit refuses. Given the
        ``body`` and budget ``candidates``, it may take the reservation too: what it returns
        goes to ``reserve(held=...)`` (or ``release``/``finish``). ``peek``: a read it carries
        when it sends a round trip to that Redis anyway (``done`` set)."""
        ...

    def candidate(
        self, policy: PolicyT, route: str, kind: str, route_policy: PolicyT, targets: Sequence[Target]
    ) -> Candidate: ...

    async def reserve(
        self,
        policy: PolicyT,
        tenant: str,
        key_id: str | None,
        body: Mapping[str, Any],
        candidates: Sequence[Candidate],
        held: Reservation | None = None,
    ) -> tuple[int, Reservation | None]:
        """Reserve the worst case on the first candidate whose budgets allow it: (its index,
        the reservation or None when no budget applies); 429 ``budget_exceeded`` otherwise.
        ``held``: what ``admit`` returned (its outcome is used when it fits ``candidates``)."""
        ...

    def settle(self, reservation: Reservation | None, cost: Decimal | None) -> None: ...

    def finish(
        self,
        policy: PolicyT,
        key_id: str | None,
        tokens: int,
        reservation: Reservation | None,
        cost: Decimal | None,
        put: SharedWrite | None = None,
    ) -> bool:
        """A served request: its tokens to the key's tokens-per-minute bucket and the
        reservation settled to ``cost`` (one background round trip with Redis, carrying
        ``put`` when it is on that Redis: True; else the caller writes it)."""
        ...

    def release(self, reservation: Reservation | None) -> None: ...

    def record_tokens(self, policy: PolicyT, key_id: str | None, tokens: int) -> None: ...

    def refresh_key_limits(self) -> None: ...

    async def status(self, policy: PolicyT) -> list[dict[str, Any]]: ...

    async def seed(
        self, policy: PolicyT, spent_since: Callable[[Any, float], Mapping[str, Decimal]]
    ) -> None: ...

    async def aclose(self) -> None: ...


class Tracer(Protocol):
    def record(self, facts: RequestFacts) -> None: ...

    def shutdown(self) -> None: ...


class MessagesStream(Protocol):
    """An accepted Anthropic Messages stream: (event name, data bytes as sent, parsed data)."""

    usage: Usage | None

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes, dict[str, Any]]]: ...

    async def aclose(self) -> None: ...


class MessagesUpstream(Protocol):
    """A provider that speaks Anthropic Messages itself: the client's body goes out as it is
    (only ``model`` replaced), the answer comes back as it is."""

    async def messages(
        self, body: dict[str, Any], target: Target, timeout: float, forwarded: Mapping[str, str]
    ) -> RawResult: ...

    async def messages_stream(
        self,
        body: dict[str, Any],
        target: Target,
        timeout: float,
        idle_timeout: float,
        forwarded: Mapping[str, str],
    ) -> MessagesStream: ...

    async def count_tokens(
        self, body: dict[str, Any], target: Target, timeout: float, forwarded: Mapping[str, str]
    ) -> int | None:
        """The upstream's own count of a Messages body's input tokens (None: it gave none)."""
        ...


class ResponsesStream(Protocol):
    """An accepted OpenAI Responses stream: (event type, data bytes as sent, parsed data).
    Iteration ends after the terminal event (``response.completed``, ``.incomplete`` or
    ``.failed``; ``response`` then holds its Response object); an ``error`` event, a malformed
    event or an end before a terminal event raises StreamBrokenError."""

    usage: Usage | None
    response: dict[str, Any] | None

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes, dict[str, Any]]]: ...

    async def aclose(self) -> None: ...


class ResponsesUpstream(Protocol):
    """A provider that speaks the OpenAI Responses API itself: the client's body goes out as
    it is (only ``model`` replaced), the answer comes back as it is."""

    async def responses(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult: ...

    async def responses_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> ResponsesStream: ...


class StoredResponse(Protocol):
    """One stored Responses API response: the Response object and the request's own input items."""

    @property
    def response(self) -> dict[str, Any]: ...

    @property
    def input_items(self) -> list[dict[str, Any]]: ...


class ResponseStore(Protocol):
    """Conversation state of the Responses API, per tenant, kept for a TTL (another tenant's
    id, or an expired one, is not found)."""

    async def put(
        self,
        tenant: str,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
        previous_id: str | None,
    ) -> None: ...

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def conversation(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """Every item up to ``response_id``'s output, oldest first (None: not stored, or a link of
        its ``previous_response_id`` chain is missing)."""
        ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    def close(self) -> None: ...


class Stickiness(Protocol):
    """Conversation key -> the catalog model that last served it (routing/sticky.py: in this
    process; routing/sticky_redis.py: shared by every replica of one Redis, with a TTL).

    A shared store's read and write can ride on another part's Redis round trip (the limits'
    scripts, core/carry.py): ``peek`` makes the read, ``recall`` takes it when it was carried;
    ``remember`` returns the write, which the caller hands to a carrier or to ``write``."""

    def peek(self, key: str) -> SharedRead | None:
        """The read a carrier may make for ``recall`` (None: nothing shared to read)."""
        ...

    async def recall(self, key: str, peeked: SharedRead | None = None) -> str | None:
        """The conversation's model, or None (new, expired, or the store is unreachable)."""
        ...

    def remember(self, key: str, model: str, recalled: str | None) -> SharedWrite | None:
        """``model`` served the conversation (``recalled``: what ``recall`` said). Returns the
        shared write still to make (only when the model differs), for a carrier or ``write``."""
        ...

    def write(self, put: SharedWrite) -> None:
        """Make a write ``remember`` returned that nothing carried (in the background)."""
        ...

    async def aclose(self) -> None: ...
