"""Every Prometheus metric Switchyard exports, in one place.

Labels are bounded: route/model/provider names come from the policy, tenant names from the
key store, status/cache/kind from fixed vocabularies. Never a request id or raw user text.
With several workers, prometheus_client's multiprocess mode aggregates them (see
config.settings.export_serve_environment).
"""

from __future__ import annotations

from bisect import bisect_left
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prom_mp

from gateway.config.settings import MULTIPROC_ENV, library_env

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1)


class _Tally:
    """A counter child whose increments add up in a plain float until ``flush``."""

    __slots__ = ("child", "pending")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.pending = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            amount, self.pending = self.pending, 0.0
            self.child.inc(amount)


class _Spread:
    """A histogram child whose observations add up in plain counts until ``flush``: the
    bucket an observation falls in is the first upper bound it does not exceed, as in
    prometheus_client's ``Histogram.observe``."""

    __slots__ = ("bounds", "child", "counts", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)  # the last one is +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        self.total += amount
        if amount == amount:  # NaN falls in no bucket
            self.counts[bisect_left(self.bounds, amount)] += 1

    def flush(self) -> None:
        counts, total = self.counts, self.total
        if not any(counts) and not total:
            return
        self.counts, self.total = [0] * len(counts), 0.0
        self.child._sum.inc(total)
        for bucket, n in zip(self.child._buckets, counts, strict=True):
            if n:
                bucket.inc(n)


class _Memo:
    """A labelled metric whose children are looked up once per label set: prometheus_client's
    own ``labels()`` validates and locks on every call, which is measurable at 3,000 req/s.
    Label sets are bounded (see the module docstring); the memo is capped anyway.

    ``deferred`` (one process, no ``PROMETHEUS_MULTIPROC_DIR``): counter and histogram children
    are handed out wrapped (``_Tally``, ``_Spread``), which add up in plain Python numbers and
    reach prometheus_client at ``flush`` (``Metrics.render`` flushes first, so a scrape reads
    every update before it): a request's eight metric updates cost a lock, a validation call
    and (histograms) a bucket scan each otherwise. Updates come from the event loop thread
    only (the wrappers are not thread-safe). With several workers each update goes straight
    to the shared files, as other workers' scrapes read them."""

    __slots__ = ("_children", "_wrapped", "metric")

    MAX_CHILDREN = 10_000

    def __init__(self, metric: Any, *, deferred: bool = False) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}
        self._wrapped: list[Any] | None = [] if deferred and isinstance(metric, Counter | Histogram) else None

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if len(self._children) < self.MAX_CHILDREN:
                if self._wrapped is not None:
                    child = self._wrap(child)
                self._children[values] = child
        return child

    def _wrap(self, child: Any) -> Any:
        if not isinstance(self.metric, Histogram):
            wrapped: _Tally | _Spread = _Tally(child)
        elif all(hasattr(child, a) for a in ("_upper_bounds", "_sum", "_buckets")):
            wrapped = _Spread(child)
        else:  # a prometheus_client whose internals differ: update it directly
            return child
        assert self._wrapped is not None
        self._wrapped.append(wrapped)
        return wrapped

    def flush(self) -> None:
        for child in self._wrapped or ():
            child.flush()


ENGINE_GAUGES = (
    ("up", "switchyard_engine_up", "1 while the replica's /metrics answers"),
    ("queue_depth", "switchyard_engine_queue_depth", "Requests waiting (vllm:num_requests_waiting)"),
    ("running", "switchyard_engine_running", "Requests running (vllm:num_requests_running)"),
    ("kv_cache_usage", "switchyard_engine_kv_cache_usage", "KV cache used, 0-1 (vllm:kv_cache_usage_perc)"),
    (
        "prefix_cache_hit_ratio",
        "switchyard_engine_prefix_cache_hit_ratio",
        "Prefix cache hits / queries (tokens) over the last probe interval with traffic",
    ),
    (
        "ttft_seconds",
        "switchyard_engine_ttft_seconds",
        "Mean time to first token over the last probe interval",
    ),
)


class Metrics:
    def __init__(self, multiprocess_dir: str | None = None) -> None:
        """``multiprocess_dir``: prometheus_client's multi-process directory (Settings.
        multiprocess_dir; default ``$PROMETHEUS_MULTIPROC_DIR``, which `serve --workers N` sets)."""
        self.multiprocess_dir = multiprocess_dir or library_env(MULTIPROC_ENV)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._memos: list[_Memo] = []

        def memo(metric: Any) -> _Memo:
            self._memos.append(_Memo(metric, deferred=not self.multiprocess_dir))
            return self._memos[-1]

        self.requests = memo(
            Counter(
                "switchyard_requests",
                "Requests answered, by outcome",
                ["endpoint", "route", "model", "provider", "status", "cache"],
                registry=r,
            )
        )
        self.latency = memo(
            Histogram(
                "switchyard_request_duration_seconds",
                "Total request latency as seen by the gateway",
                ["endpoint", "route", "stream"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.ttft = memo(
            Histogram(
                "switchyard_time_to_first_token_seconds",
                "Time from request arrival to the first streamed chunk sent to the client",
                ["route"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.overhead = memo(
            Histogram(
                "switchyard_gateway_overhead_seconds",
                "Latency the gateway adds: total (or TTFT for streams) minus time waiting on upstreams",
                ["endpoint", "stream"],
                buckets=OVERHEAD_BUCKETS,
                registry=r,
            )
        )
        self.tokens = memo(
            Counter("switchyard_tokens", "Tokens metered, by kind", ["route", "model", "kind"], registry=r)
        )
        self.cost = memo(
            Counter(
                "switchyard_cost_usd", "Spend in USD", ["tenant", "route", "model", "provider"], registry=r
            )
        )
        self.cache = memo(
            Counter("switchyard_cache_results", "Exact-cache lookups by result", ["result"], registry=r)
        )
        self.cache_errors = memo(
            Counter(
                "switchyard_cache_backend_errors",
                "Cache backend failures (served as misses)",
                ["backend"],
                registry=r,
            )
        )
        # Semantic cache: hits/misses count in switchyard_cache_results (semantic_hit/semantic_miss).
        self.semantic_lookup = memo(
            Histogram(
                "switchyard_semantic_lookup_seconds",
                "Semantic-cache lookup time (embed + search + verify), by route",
                ["route"],
                buckets=OVERHEAD_BUCKETS,
                registry=r,
            )
        )
        # Complexity routing: which tier the classifier sent each request to first.
        self.route_decisions = memo(
            Counter(
                "switchyard_route_decisions",
                "Classifier routing decisions (strong|cheap|self_hosted|unscored), by route",
                ["route", "decision"],
                registry=r,
            )
        )
        self.upstream_errors = memo(
            Counter(
                "switchyard_upstream_errors",
                "Failed upstream attempts",
                ["provider", "model", "code"],
                registry=r,
            )
        )
        self.usage_estimated = memo(
            Counter(
                "switchyard_usage_estimated",
                "Answers metered with the local tokenizer: usage missing or out of range, by provider",
                ["provider", "reason"],
                registry=r,
            )
        )
        self.retries = memo(
            Counter("switchyard_upstream_attempts", "Upstream attempts", ["provider", "model"], registry=r)
        )
        self.policy_reloads = memo(
            Counter("switchyard_policy_reloads", "Policy reloads by result", ["result"], registry=r)
        )
        self.rejections = memo(
            Counter(
                "switchyard_rejections", "Requests refused before any upstream call", ["code"], registry=r
            )
        )
        self.breaker_open = memo(
            Gauge(
                "switchyard_circuit_open",
                "1 while a target's circuit breaker is open",
                ["model"],
                registry=r,
                multiprocess_mode="max",
            )
        )
        self.shed = memo(
            Counter(
                "switchyard_load_shed",
                "Requests refused at once with 503 because the gateway was at capacity",
                ["reason"],
                registry=r,
            )
        )
        self.ledger_pending = Gauge(
            "switchyard_ledger_pending_rows",
            "Ledger rows waiting to be written",
            registry=r,
            multiprocess_mode="sum",
        )
        self.exact_cache_bytes = Gauge(
            "switchyard_exact_cache_bytes",
            "Memory the in-process exact cache's entries hold (bounded by cache.max_bytes)",
            registry=r,
            multiprocess_mode="sum",  # one cache per worker
        )
        self.ledger_outbox = Gauge(
            "switchyard_ledger_outbox_rows",
            "Ledger rows committed to the local outbox, waiting to be shipped to PostgreSQL",
            registry=r,
            multiprocess_mode="max",  # workers share one outbox file
        )
        self.savings = memo(
            Counter(
                "switchyard_savings_usd",
                "USD saved against the route's baseline model, by cause "
                "(exact_cache, semantic_cache, self_hosted, batch, routing)",
                ["tenant", "route", "cause"],
                registry=r,
            )
        )
        # Self-hosted engine replicas, re-exported from each vLLM /metrics scrape (engine =
        # provider name, replica = host:port from the policy: bounded).
        self.engine_gauges = {
            field: Gauge(name, doc, ["engine", "replica"], registry=r, multiprocess_mode="max")
            for field, name, doc in ENGINE_GAUGES
        }
        self.engine_spillovers = memo(
            Counter(
                "switchyard_engine_spillovers",
                "Requests sent past a saturated engine to the route's next target",
                ["engine", "reason"],
                registry=r,
            )
        )
        # Budgets and rate limits. Budget names come from the policy / key store (bounded).
        self.budget_remaining = memo(
            Gauge(
                "switchyard_budget_remaining_usd",
                "USD left in a budget's current period (limit minus spent and reserved)",
                ["scope", "name", "period"],
                registry=r,
                multiprocess_mode="min",
            )
        )
        self.limits_backend_errors = memo(
            Counter(
                "switchyard_limits_backend_errors",
                "Rate-limit/budget store (Redis) failures, by what the gateway did",
                ["action"],
                registry=r,
            )
        )

    def record_engine(self, engine: str, replica: str, values: dict[str, float | None]) -> None:
        """One probe sample of one engine replica; a None value (not known yet) is left as is."""
        for field, value in values.items():
            gauge = self.engine_gauges.get(field)
            if gauge is not None and value is not None:
                gauge.labels(engine, replica).set(value)

    def count_spillover(self, engine: str, reason: str) -> None:
        self.engine_spillovers.labels(engine, reason).inc()

    def count_cache_error(self) -> None:
        self.cache_errors.labels("redis").inc()

    def record_cost(self, tenant: str, route: str, model: str, provider: str, cost: Decimal | None) -> None:
        if cost is not None and cost > 0:
            self.cost.labels(tenant, route, model, provider).inc(float(cost))

    def record_savings(self, tenant: str, route: str, cause: str, saved: Decimal | None) -> None:
        """Count positive savings only (a counter never goes down); Decimal -> float here."""
        if saved is not None and saved > 0 and cause != "none":
            self.savings.labels(tenant, route, cause).inc(float(saved))

    def flush(self) -> None:
        """Hand every deferred update to prometheus_client (``_Memo``): before any read."""
        for memo in self._memos:
            memo.flush()

    def render(self) -> bytes:
        self.flush()
        mp_dir = self.multiprocess_dir
        if mp_dir:
            registry = CollectorRegistry()
            prom_mp.MultiProcessCollector(registry, path=mp_dir)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(registry))
        return bytes(generate_latest(self.registry))
