"""What the pipeline holds for the semantic cache and the shared embedding: one per process.

Importing this module loads nothing heavy (no numpy, faiss, onnxruntime or torch): they are
imported on the first request of a route that enables the semantic cache or the classifier
(``warm`` loads them at start-up when the policy has such a route)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cache.model_errors import ModelUnavailable
from gateway.cache.semantic_key import SemanticKey, semantic_key
from gateway.config.policy import CachePolicy, Policy
from gateway.core.ports import Spawn, TaskHandle

if TYPE_CHECKING:
    from gateway.cache.embedder import Embedder
    from gateway.cache.semantic import Lookup, SemanticCache
    from gateway.cache.semantic_redis import RedisSemanticStore

log = logging.getLogger("switchyard.semcache")


@dataclass(slots=True)
class SemanticResult:
    """One lookup: its key, the query vector (shared with the classifier) and the result."""

    key: SemanticKey
    vector: Any  # numpy float32 (384,)
    lookup: Lookup
    seconds: float


# The longest lookup text the semantic cache embeds and stores (an embedder reads a few hundred
# tokens anyway); a longer last user message skips the semantic cache, lookup and store alike.
MAX_TEXT_CHARS = 16 * 1024


class SemanticLayer:
    def __init__(
        self,
        redis_url: str | None = None,
        *,
        backend: str = "auto",
        home: Path | None = None,
        model_dir: Path | None = None,
        on_redis_error: Callable[[], None] | None = None,
        spawn: Spawn,
    ) -> None:
        self._spawn = spawn
        self._redis_url = redis_url
        self._backend = backend
        self._home = home
        self._model_dir = model_dir
        self._on_redis_error = on_redis_error
        self._embedder: Embedder | None = None
        self._embed_lock: asyncio.Lock | None = None
        self._cache: SemanticCache | None = None
        self._config: tuple[object, ...] | None = None
        self._store: RedisSemanticStore | None = None
        self._starting: list[TaskHandle] = []
        self._warming = 0  # warm-ups in flight: /readyz says 503 until they are done

    # ------------------------------------------------------------------ shared embedder
    async def embedder(self) -> Embedder:
        """The process-wide embedder, loaded in a thread on first use."""
        if self._embedder is None:
            if self._embed_lock is None:
                self._embed_lock = asyncio.Lock()
            async with self._embed_lock:
                if self._embedder is None:
                    mod: Any = importlib.import_module("gateway.cache.embedder")
                    self._embedder = await asyncio.to_thread(
                        mod.load_embedder, self._backend, self._home, self._model_dir
                    )
        assert self._embedder is not None
        return self._embedder

    @staticmethod
    def wanted(policy: Policy) -> bool:
        return any(r.semantic_cache.enabled for r in policy.routes.values())

    @staticmethod
    def embedder_wanted(policy: Policy) -> bool:
        """The embedder serves the semantic cache and the complexity classifier."""
        routes = policy.routes.values()
        return any(r.semantic_cache.enabled or r.classifier is not None for r in routes)

    @property
    def ready(self) -> bool:
        """False while a warm-up runs (``/readyz`` answers 503 until every route's models are in)."""
        return self._warming == 0

    def start_warm(self, policy: Policy) -> None:
        """Begin loading what the routes of ``policy`` use (embedder, verifier) in the background;
        ``ready`` is False from now until it is done. Routes that use neither load nothing."""
        if not self.embedder_wanted(policy):
            return
        self._warming += 1
        self._starting.append(self._spawn(self.warm(policy)))

    async def warm(self, policy: Policy) -> None:
        """Load the embedder (and the cache's verifier) now, so the first request does not pay
        for it. A failure is logged (the first request tries again; a missing extra is named)."""
        routes = ", ".join(
            n for n, r in policy.routes.items() if r.semantic_cache.enabled or r.classifier is not None
        )
        started = time.perf_counter()
        try:
            try:
                mod: Any = importlib.import_module("gateway.cache.embedder")
            except ModuleNotFoundError as exc:
                log.warning(
                    "routes %s: the semantic cache and the classifier need the ml extra "
                    "(pip install 'switchyard[ml]'; missing module %s); serving without them",
                    routes,
                    exc.name,
                )
                return
            what = mod.describe_load(self._backend, self._home, self._model_dir)
            log.info("warming the embedder for routes %s (%s)", routes, what)
            await self.embedder()
            if self.wanted(policy):
                await self.cache(policy.cache)
            log.info("embedder ready for routes %s in %.1f s", routes, time.perf_counter() - started)
        except ModelUnavailable as exc:  # the ml extra without its model package: say so
            log.warning("routes %s: %s; serving without the semantic cache and the classifier", routes, exc)
        except Exception:  # the first lookup tries again (and counts as a miss if it fails)
            log.exception("semantic cache: loading the embedder failed")
        finally:
            self._warming = max(0, self._warming - 1)

    # ------------------------------------------------------------------ the cache
    def _redis_for(self, c: CachePolicy) -> str | None:
        return self._redis_url or (c.redis_url if c.backend == "redis" else None)

    async def cache(self, c: CachePolicy) -> SemanticCache:
        """The cache for this cache policy (rebuilt when its settings change on a reload)."""
        config = (self._redis_for(c), c.semantic_max_entries, c.semantic_redis_prefix)
        if self._cache is not None and self._config == config:
            return self._cache
        sem: Any = importlib.import_module("gateway.cache.semantic")
        ver: Any = importlib.import_module("gateway.cache.verifier")
        cache: SemanticCache = sem.SemanticCache(ver.load_verifier(), max_entries=c.semantic_max_entries)
        old_cache, old_store = self._cache, self._store
        self._cache, self._config, self._store = cache, config, None
        url = config[0]
        if url:
            red: Any = importlib.import_module("gateway.cache.semantic_redis")
            store: RedisSemanticStore = red.RedisSemanticStore(
                url, prefix=c.semantic_redis_prefix, max_entries=c.semantic_max_entries,
                on_error=self._on_redis_error, spawn=self._spawn,
            )  # fmt: skip
            self._store = store
            cache.sink = store
            self._starting.append(self._spawn(store.start(cache)))  # rebuild in the background
        if old_store is not None:
            await old_store.aclose()
        if old_cache is not None:
            old_cache.close()
        return cache

    async def lookup(
        self, policy: Policy, route: str, tenant: str, body: dict[str, Any], protocol: str = "chat"
    ) -> SemanticResult | None:
        """Embed the last user message and look it up among the entries of ``protocol``'s
        answers; None when the request has no text to key on."""
        cfg = policy.routes[route].semantic_cache
        key = semantic_key(tenant, route, body, protocol)
        if key is None or len(key.text) > MAX_TEXT_CHARS:
            return None  # a huge prompt is neither embedded (CPU) nor stored (memory)
        started = time.perf_counter()
        emb = await self.embedder()
        vector = await emb.embed(key.text)
        cache = await self.cache(policy.cache)
        found = cache.lookup(key.context, key.text, vector, cfg.threshold)
        return SemanticResult(key, vector, found, time.perf_counter() - started)

    def store(self, result: SemanticResult, payload: bytes, ttl: float) -> None:
        """Store a fresh answer. When the lookup's best candidate scored in the online band
        (below its cut, above the floor), the fresh answer is feedback on that entry
        (``answer_match.same_answer``): an identical answer confirms it (and the question becomes
        one of the entry's paraphrases instead of a new entry), any other refutes it."""
        cache = self._cache
        if cache is None:
            return
        found = result.lookup
        if found.uid is not None and not found.hit and cache.online.floor <= found.score < found.cut:
            cached = cache.entry_payload(found.uid)
            if cached is not None:
                match: Any = importlib.import_module("gateway.cache.answer_match")
                same = bool(match.same_answer(cached, payload))
                cache.observe(found.uid, found.score, same)
                if same and cache.add_alias(found.uid, result.key.text, result.vector):
                    return
        cache.insert(result.key.context, result.key.text, result.vector, payload, ttl, found.rules)

    async def aclose(self) -> None:
        for task in self._starting:
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        if self._store is not None:
            await self._store.aclose()
        if self._cache is not None:
            self._cache.close()
        if self._embedder is not None:
            self._embedder.close()
