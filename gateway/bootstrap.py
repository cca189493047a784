"""The one composition root: Settings + Policy -> Services; reload -> new Services; shutdown.

This is the only module that calls the constructors of the parts that do I/O (ledger, key
store, caches, Redis limits, providers, tracer). The HTTP app (gateway/api/app.py) and the CLI
start a ``Gateway`` here and read ``gateway.services``; nothing else builds or patches parts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.cache.exact import MemoryCache, RedisCache
from gateway.cache.semantic_layer import SemanticLayer
from gateway.config.loader import PolicyError, load_policy
from gateway.config.policy import CachePolicy, Policy, ProviderPolicy
from gateway.config.settings import Settings
from gateway.core.ports import ExactCache, Ledger, Provider, Stickiness, Tracer
from gateway.core.ports_batch import BatchUpstream
from gateway.flow import learning
from gateway.flow.batch_runner import BatchRunner
from gateway.flow.services import Services, TaskOwner
from gateway.ledger.batch_files import open_file_store
from gateway.ledger.batches import open_batch_store
from gateway.ledger.feedback import FeedbackStore
from gateway.ledger.open import open_ledger
from gateway.ledger.responses import open_response_store
from gateway.ledger.tokens import count_prompt_tokens
from gateway.limits.gate import Limits
from gateway.limits.key_cache import KeyCache
from gateway.limits.key_watch import KeyWatch
from gateway.limits.keys import KeyStoreBase
from gateway.limits.redis_store import RedisStore
from gateway.limits.stores import open_key_store
from gateway.limits.worst_case import prompt_token_bound
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.anthropic_batch import AnthropicBatchUpstream
from gateway.providers.openai_batch import OpenAIBatchUpstream
from gateway.providers.openai_compat import OpenAICompatProvider
from gateway.providers.replicated import ReplicatedProvider
from gateway.routing.balancer import ReplicaBalancer
from gateway.routing.breaker import BreakerBoard
from gateway.routing.engine_load import EngineBoard
from gateway.routing.router import Router
from gateway.routing.sticky import StickyConversations
from gateway.routing.sticky_redis import RedisSticky
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.redaction import Redactor, install
from gateway.telemetry.tracing import build_tracer

log = logging.getLogger("switchyard")

RETIRE_GRACE_S = 120.0  # retired providers/caches close after in-flight requests had time to end


# --------------------------------------------------------------------------- the parts
def _provider_key(p: ProviderPolicy) -> tuple[object, ...]:
    engine = (tuple(p.replicas), p.balance, p.affinity) if p.replicas else ()
    return (p.type, p.base_url, p.api_key, tuple(sorted(p.headers.items())), p.auto_cache_control, *engine)


def _provider(name: str, p: ProviderPolicy, engines: EngineBoard) -> Provider:
    if p.replicas:  # an engine with replicas: one client per replica behind a balancer
        balancer = ReplicaBalancer(
            p.replicas,
            p.balance,
            prefix_chars=p.affinity.prefix_chars,
            load_factor=p.affinity.load_factor,
            available=lambda url: engines.replica_available(name, url),
        )
        clients = [OpenAICompatProvider(name, url, p.api_key, p.headers) for url in p.replicas]
        return ReplicatedProvider(name, clients, balancer)
    if p.type == "anthropic":
        return AnthropicProvider(
            name, p.base_url, p.api_key, p.headers, auto_cache_control=p.auto_cache_control
        )
    return OpenAICompatProvider(name, p.base_url, p.api_key, p.headers)


def _exact_cache(c: CachePolicy, settings: Settings, metrics: Metrics) -> ExactCache:
    """Redis when SWITCHYARD_REDIS_URL is set (replicas share one Redis) or the policy asks
    for it; otherwise the in-process LRU."""
    url = settings.redis_url or (c.redis_url if c.backend == "redis" else None)
    if url:
        return RedisCache(url, c.redis_timeout_s, c.max_entry_bytes, on_error=metrics.count_cache_error)
    return MemoryCache(c.max_bytes, c.max_entry_bytes)


def prompt_tokens(body: Mapping[str, Any], model: str) -> int:
    """Prompt tokens for a budget reservation: the tokenizer's count plus 1/8 and 8 tokens of
    margin (other vendors' tokenizers count a little differently); the byte bound if the
    tokenizer fails."""
    try:
        n = count_prompt_tokens(dict(body), model)
    except Exception:
        return prompt_token_bound(body)
    return n + n // 8 + 8


def _limits(
    settings: Settings, policy: Policy, keys: KeyStoreBase, metrics: Metrics, tasks: TaskOwner
) -> Limits:
    lp = policy.limits
    url = settings.redis_url or lp.redis_url
    redis = RedisStore(url, lp.redis_prefix, lp.redis_timeout_s) if url else None
    limits = Limits(
        redis,
        prompt_tokens=prompt_tokens,
        fail_open=lp.on_redis_error == "open",
        key_limits=keys.all_limits,
        on_backend_error=lambda action: metrics.limits_backend_errors.labels(action).inc(),
        spawn=tasks.spawn,
    )
    limits.refresh_key_limits()
    if redis is None and settings.multiprocess_dir and limits.configured(policy):
        log.warning(
            "budgets are kept per worker process without Redis: with --workers N each worker "
            "may spend a whole budget; set SWITCHYARD_REDIS_URL (or limits.redis_url)"
        )
    return limits


def _sticky(settings: Settings, policy: Policy, metrics: Metrics, tasks: TaskOwner) -> Stickiness:
    """Conversation stickiness: in the Redis the limits use when there is one (every replica
    sees where a conversation lives; a TTL forgets it), else in this process."""
    lp = policy.limits
    url = settings.redis_url or lp.redis_url
    if not url:
        return StickyConversations()
    return RedisSticky(
        url,
        prefix=lp.redis_prefix + "sticky:",
        timeout_s=lp.redis_timeout_s,
        spawn=tasks.spawn,
        on_error=lambda: metrics.limits_backend_errors.labels("sticky_local").inc(),
    )


async def seed_budgets(limits: Limits, policy: Policy, ledger: Ledger) -> None:
    """Start every budget at what its period already spent, as the ledger itself counts it (a
    PostgreSQL ledger includes the rows still waiting in its outbox)."""

    def spent(scope: str, since_ts: float) -> dict[str, Decimal]:
        try:
            return ledger.spent_since(scope, since_ts)
        except Exception:
            log.exception("could not read spend from the ledger to seed the budgets")
            return {}

    started = time.perf_counter()
    await limits.seed(policy, spent)
    log.debug("budgets seeded in %.1f ms", (time.perf_counter() - started) * 1000)


def _tracer(settings: Settings, policy: Policy) -> Tracer | None:
    endpoint = settings.otlp_endpoint or policy.telemetry.otlp_endpoint
    return build_tracer(endpoint, policy.telemetry.service_name) if endpoint else None


def rebuild(previous: Services, policy: Policy) -> tuple[Services, list[object]]:
    """Services for a new policy, reusing the providers and cache whose configuration did not
    change; returns the retired parts too (closed after a grace period)."""
    old = previous.policy.providers
    providers: dict[str, Provider] = {}
    for name, cfg in policy.providers.items():
        same = name in old and name in previous.providers and _provider_key(old[name]) == _provider_key(cfg)
        providers[name] = previous.providers[name] if same else _provider(name, cfg, previous.engines)
    retired: list[object] = [p for n, p in previous.providers.items() if providers.get(n) is not p]
    cache = previous.cache
    if previous.policy.cache != policy.cache:
        cache = _exact_cache(policy.cache, previous.settings, previous.metrics)
        retired.append(previous.cache)
    previous.engines.configure(policy)
    previous.breakers.configure(policy.breaker.failure_threshold, policy.breaker.open_seconds)
    services = dataclasses.replace(
        previous,
        policy=policy,
        router=Router(policy),
        providers=providers,
        cache=cache,
        secrets=_secrets(policy),
        batch_upstreams=_batch_upstreams(policy),
    )
    return services, retired


def _batch_upstreams(policy: Policy) -> dict[str, BatchUpstream]:
    """The batch API of every provider that is neither an engine nor replicas."""
    out: dict[str, BatchUpstream] = {}
    for name, p in policy.providers.items():
        if p.self_hosted or p.replicas:
            continue
        if p.type == "anthropic":
            out[name] = AnthropicBatchUpstream(name, p.base_url, p.api_key, p.headers)
        else:
            out[name] = OpenAIBatchUpstream(name, p.base_url, p.api_key, p.headers, p.speaks_responses)
    return out


def _secrets(policy: Policy) -> tuple[str, ...]:
    """Every configured secret value, for redaction: each provider's API key and every value
    of its ``headers`` (whatever the header), with the token after an auth scheme
    (``Bearer x``, ``Basic x``) on its own too, since upstreams echo either form."""
    out: list[str] = []
    for p in policy.providers.values():
        for value in (p.api_key, *p.headers.values()):
            if not value:
                continue
            out.append(value)
            scheme, _, token = value.strip().partition(" ")
            if token.strip() and scheme.isalpha():
                out.append(token.strip())
    return tuple(dict.fromkeys(out))


def _warn_unconfigured(policy: Policy) -> None:
    unconfigured = [n for n, p in policy.providers.items() if not p.configured]
    if unconfigured:
        log.warning("providers without an API key are skipped by the router: %s", ", ".join(unconfigured))


def key_store(settings: Settings) -> KeyStoreBase:
    """The key store ``settings`` name: SQLite in the home, or the PostgreSQL ledger's (the
    CLI's keys commands; a running gateway opens its own in ``start``)."""
    return open_key_store(settings)


def offline_limits(store: KeyStoreBase) -> Limits:
    """In-process limits over ``store``'s key limits, for the CLI's budget report."""
    return Limits(key_limits=store.all_limits, spawn=TaskOwner().spawn)


# --------------------------------------------------------------------------- the gateway
class Gateway:
    """A running gateway: the current ``Services``, hot reload, and shutdown."""

    def __init__(self, services: Services, key_store: KeyStoreBase) -> None:
        self._services = services
        self._key_store = key_store
        self._reload_lock = asyncio.Lock()
        self.batch_runner = BatchRunner(lambda: self._services)
        self._redact()

    @property
    def services(self) -> Services:
        return self._services

    def swap(self, services: Services) -> None:
        """Install a new bundle whole (a reload does; tests inject a part this way)."""
        self._services = services
        self._redact()

    @property
    def settings(self) -> Settings:
        return self._services.settings

    @property
    def tasks(self) -> TaskOwner:
        return self._services.tasks

    def _redact(self) -> None:
        admin = self.settings.admin_key.get() if self.settings.admin_key else ""
        install(Redactor((*self._services.secrets, admin)))

    async def reload(self) -> PolicyError | None:
        """Load the policy file again. On any problem keep the running policy and return the
        error (with every problem); None means the new policy is live."""
        async with self._reload_lock:
            svc = self._services
            try:
                policy = await asyncio.to_thread(load_policy, svc.settings.policy_path)
                if not (policy.providers or policy.models or policy.routes) and svc.policy.routes:
                    # An empty file parses as an empty policy; on a reload it is a file caught
                    # mid-write (or truncated), not a wish to drop every route.
                    raise PolicyError(
                        str(svc.settings.policy_path),
                        [("", "the policy file is empty (being written?); it would remove every route")],
                    )
                fresh, retired = rebuild(svc, policy)
            except PolicyError as exc:
                svc.metrics.policy_reloads.labels("error").inc()
                log.warning("policy reload rejected, keeping the running policy:\n%s", exc.render())
                return exc
            self.swap(fresh)
            fresh.semantic.start_warm(policy)  # a route that now uses the embedder: loaded before ready
            _warn_unconfigured(policy)
            svc.metrics.policy_reloads.labels("ok").inc()
            log.info("policy reloaded from %s", svc.settings.policy_path)
            if retired:
                self.tasks.daemon(_close_later(retired, RETIRE_GRACE_S))
            return None

    async def watch_policy(self, interval: float) -> None:
        """Reload when the policy file changes (every worker process watches on its own, so
        `--workers N` and Kubernetes ConfigMap updates converge without a signal)."""
        path = self.settings.policy_path
        last = _file_stamp(path)
        while True:
            await asyncio.sleep(interval)
            stamp = _file_stamp(path)
            if stamp != last and stamp is not None:
                last = stamp
                await self.reload()

    async def aclose(self) -> None:
        svc = self._services
        await svc.semantic.aclose()
        await svc.tasks.aclose()
        await svc.limits.aclose()
        await svc.sticky.aclose()
        if svc.tracer is not None:
            svc.tracer.shutdown()
        await close_parts([*svc.providers.values(), svc.cache])
        await asyncio.to_thread(svc.ledger.close)
        if svc.responses is not None:
            svc.responses.close()
        if svc.batches is not None:
            svc.batches.close()
        if svc.feedback is not None:
            svc.feedback.close()
        if svc.files is not None:
            svc.files.close()
        self._key_store.close()


@dataclasses.dataclass
class StartProgress:
    """What ``start`` is doing now: a gateway still starting says so (``api.starting``)."""

    phase: str = "starting"
    ledger: Ledger | None = None  # while the ledger starts: its own phase adds the detail

    def describe(self) -> str:
        return f"{self.phase}: {self.ledger.phase}" if self.ledger is not None else self.phase


async def _in_daemon_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` off the loop in a daemon thread: unlike ``asyncio.to_thread``'s pool, a
    shutdown during a long migration does not wait for it (its transaction rolls back)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc is not None else done.set_result(None)

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome: BaseException | None = exc
        else:
            outcome = None
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="switchyard-start", daemon=True).start()
    await done


async def start(settings: Settings, progress: StartProgress | None = None) -> Gateway:
    """Build everything for ``settings`` (a bad policy raises PolicyError with every problem),
    start the ledger writer and the background tasks, seed the budgets. ``progress`` follows
    the phases (the ledger's start, which may migrate a big database, runs off the loop)."""
    progress = progress or StartProgress()
    progress.phase = "loading the policy"
    policy = load_policy(settings.policy_path)
    metrics, tasks = Metrics(settings.multiprocess_dir), TaskOwner()
    settings.home.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(  # postgresql://: outbox in home
        settings.ledger_url, home=settings.home, conversation_spans=settings.conversation_spans
    )
    progress.phase, progress.ledger = "starting the ledger", ledger
    await _in_daemon_thread(ledger.start)
    progress.phase, progress.ledger = "seeding the budgets", None
    responses = open_response_store(settings.ledger_url, settings.home)
    await asyncio.to_thread(responses.prepare)  # PostgreSQL: every table by the migrations, now
    key_store = open_key_store(settings)  # PostgreSQL ledger: keys shared there
    limits = _limits(settings, policy, key_store, metrics, tasks)
    await seed_budgets(limits, policy, ledger)
    engines = EngineBoard()
    engines.configure(policy)
    semantic = SemanticLayer(
        settings.redis_url,
        backend=settings.embedder,
        home=settings.home,
        model_dir=settings.model_dir,
        on_redis_error=metrics.count_cache_error,
        spawn=tasks.spawn,
    )
    services = Services(
        settings=settings,
        policy=policy,
        router=Router(policy),
        providers={n: _provider(n, p, engines) for n, p in policy.providers.items()},
        cache=_exact_cache(policy.cache, settings, metrics),
        semantic=semantic,
        limits=limits,
        ledger=ledger,
        keys=KeyCache(key_store, on_record=lambda rec: limits.learn(rec.key_id, rec.limits)),
        metrics=metrics,
        breakers=BreakerBoard(policy.breaker.failure_threshold, policy.breaker.open_seconds),
        engines=engines,
        tasks=tasks,
        tracer=_tracer(settings, policy),
        secrets=_secrets(policy),
        responses=responses,
        sticky=_sticky(settings, policy, metrics, tasks),
        batches=open_batch_store(settings.ledger_url),  # tables of the ledger's migrations
        files=open_file_store(settings.ledger_url, settings.home),  # PostgreSQL: shared by replicas
        batch_upstreams=_batch_upstreams(policy),
        feedback=None if settings.ledger_url.strip() == "none" else FeedbackStore(settings.ledger_url),
    )
    _warn_unconfigured(policy)
    gateway = Gateway(services, key_store)
    semantic.start_warm(policy)  # loads the embedder only if a route uses it; /readyz 503 until then
    progress.phase = "started"
    tasks.daemon(engines.run(metrics.record_engine))  # engine /metrics probe (idle if none)
    tasks.daemon(KeyWatch(key_store, services.keys, limits).run())  # key changes made elsewhere
    tasks.daemon(gateway.batch_runner.run())  # Batch API items (idle without open batches)
    tasks.daemon(learning.sync(lambda: gateway.services))  # learned routes' shared evidence
    if settings.policy_watch_s > 0:
        tasks.daemon(gateway.watch_policy(settings.policy_watch_s))
    return gateway


# --------------------------------------------------------------------------- closing
def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


async def _close_later(parts: list[object], delay: float) -> None:
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
