"""The routing policy schema (YAML). Pydantic with extra="forbid" everywhere; cross-references
(route -> model -> provider) are checked after parsing with the YAML path of each error. A
route's optional lanes (batch, compression, learned routing, cascades, shadow evaluation):
config/route_extras.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.route_extras import (
    BatchesPolicy,
    CascadePolicy,
    CompressionPolicy,
    LearnPolicy,
    RouteBatchPolicy,
    ShadowPolicy,
)
from gateway.config.strict import Strict as _Strict

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class ServerPolicy(_Strict):
    auth: Literal["keys", "none"] = "keys"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    log_prompts: bool = False
    # One INFO line per request (gateway/flow/access_log.py): id, tenant, route, models, status,
    # error code, latency; never a key or a prompt.
    access_log: bool = True
    # Requests in flight per worker (streams until they end); more get a fast 503 with
    # Retry-After (see api/overload.py). null: no limit.
    max_in_flight: int | None = Field(default=1024, gt=0)
    overload_retry_after_s: int = Field(default=1, ge=1, le=3600)
    # A request body must arrive whole within this time (else 408): a client that never
    # finishes its body cannot hold an admission slot for longer.
    body_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    # Requests whose body is still arriving, per worker (their own bound, not max_in_flight:
    # a slow body holds a socket, not a model call); more get a fast 503. null: no limit.
    max_body_reads: int | None = Field(default=4096, gt=0)
    # A key the key store confirmed is trusted from memory this long (a revoke made elsewhere,
    # e.g. on another replica, takes effect within it) ...
    key_cache_ttl_s: float = Field(default=5.0, gt=0, le=3600)
    # ... and, while the key store is unreachable, this much longer at most (then 503); 0: a
    # revoke takes effect within key_cache_ttl_s even during an outage.
    key_outage_grace_s: float = Field(default=55.0, ge=0, le=86400)


class EngineLoadPolicy(_Strict):
    """When a self-hosted engine counts as saturated (its requests then spill over to the route's
    next target until it recovers). Read from each replica's vLLM /metrics every probe_interval_s;
    a threshold left null is not checked."""

    max_waiting: int | None = Field(default=None, ge=0)  # vllm:num_requests_waiting per replica
    max_kv_usage: float | None = Field(default=None, gt=0, le=1)  # vllm:kv_cache_usage_perc (0-1)
    ttft_slo_s: float | None = Field(default=None, gt=0)  # recent mean time to first token
    probe_interval_s: float = Field(default=2.0, gt=0, le=300)
    probe_timeout_s: float = Field(default=1.0, gt=0, le=60)


class AffinityPolicy(_Strict):
    """Prefix affinity among an engine's replicas: consistent hashing of the prompt's leading
    characters with bounded load (a replica takes at most load_factor x the mean in-flight)."""

    prefix_chars: int = Field(default=1024, ge=16)  # ~ two 128-token KV blocks of English text
    load_factor: float = Field(default=1.25, ge=1.0, le=10.0)


class ProviderPolicy(_Strict):
    type: Literal["openai", "anthropic"]
    base_url: str
    # Secrets: kept out of repr/str (reprs end up in logs, tracebacks and debuggers).
    api_key: str | None = Field(default=None, repr=False)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    # A provider whose key resolved to empty is skipped by the router when it needs a key.
    key_required: bool = True
    # Our own engine (vLLM): its models are priced from price/price_calibration, never from
    # the built-in catalog, and their savings count as "self_hosted".
    self_hosted: bool = False
    # Engine replicas (OpenAI base URLs of identical vLLM servers); empty: base_url alone.
    replicas: list[str] = Field(default_factory=list)
    balance: Literal["prefix_affinity", "least_loaded", "round_robin"] = "prefix_affinity"
    affinity: AffinityPolicy = Field(default_factory=AffinityPolicy)
    load: EngineLoadPolicy | None = None  # probe vLLM /metrics and spill over when saturated
    # Anthropic, for chat-completions clients: mark the stable prefix (system, tools, earlier
    # turns) with cache_control when it is long enough to be cached (gateway/protocols/
    # anthropic_outbound.py, add_cache_breakpoints, says when a write pays for itself).
    auto_cache_control: bool = False
    # Speaks the OpenAI Responses API (``POST {base_url}/responses``): /v1/responses requests
    # routed here are passed through (body unchanged but ``model``, events relayed as sent)
    # instead of translated to chat. null: true for type openai on api.openai.com, else false
    # (vLLM and most OpenAI-compatible servers serve chat completions only).
    # "auto" (or empty, as `${OPENAI_RESPONSES:-auto}` gives) is null.
    responses: bool | None = None

    @field_validator("responses", mode="before")
    @classmethod
    def _responses_auto(cls, v: object) -> object:
        return None if v in ("auto", "") else v

    @property
    def speaks_responses(self) -> bool:
        if self.responses is not None:
            return self.responses
        host = self.base_url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
        return self.type == "openai" and host == "api.openai.com" and not self.replicas

    @field_validator("replicas")
    @classmethod
    def _replica_urls(cls, v: list[str]) -> list[str]:
        out = [u.rstrip("/") for u in v]
        if any(not u.startswith(("http://", "https://")) for u in out):
            raise ValueError("every replica must start with http:// or https://")
        if len(set(out)) != len(out):
            raise ValueError("replicas must be distinct")
        return out

    @property
    def replica_urls(self) -> list[str]:
        return self.replicas or [self.base_url]

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @property
    def configured(self) -> bool:
        return bool(self.api_key) or not self.key_required


class PricePolicy(_Strict):
    """USD per 1M tokens."""

    input: Decimal = Field(ge=0)
    output: Decimal = Field(ge=0)
    cached_input: Decimal | None = Field(default=None, ge=0)
    cache_write: Decimal | None = Field(default=None, ge=0)
    cache_write_1h: Decimal | None = Field(default=None, ge=0)  # Anthropic 1-hour cache writes
    batch: Decimal | None = Field(default=None, ge=0, le=1)  # the batch API's price: this share of the above


class ModelPolicy(_Strict):
    provider: str
    upstream: str | None = None  # upstream model id; defaults to the catalog name
    kind: Literal["chat", "completions", "embeddings"] = "chat"
    # None: from price_calibration, else the built-in catalog (config/catalog.py) by upstream
    # id; the loader fills it in and a model with no price at all is a policy error.
    price: PricePolicy | None = None
    price_calibration: str | None = None  # `switchyard engine bench` JSON, relative to the policy
    context_window: int | None = Field(default=None, gt=0)
    # Budgets: the output tokens reserved when a client sends no max_tokens (else the route's).
    max_output_tokens: int | None = Field(default=None, gt=0)
    # Complexity routing over N models (classifier.select: cheapest): the model's ability on the
    # difficulty model's logit scale, or its public MMLU-Pro accuracy (mapped to an ability by
    # the map fitted in the difficulty weights). Neither: the ability fitted for a model of that
    # name in the training data, else the route is refused at load.
    ability: float | None = None
    mmlu_pro: float | None = Field(default=None, gt=0, lt=1)


class BudgetPolicy(_Strict):
    """USD caps per UTC day / calendar month; None = no cap."""

    daily_usd: Decimal | None = Field(default=None, gt=0)
    monthly_usd: Decimal | None = Field(default=None, gt=0)


class BudgetExceededPolicy(_Strict):
    spill_to: str | None = None  # a route or model (cheaper/free) served instead of refusing


class ParamsPolicy(_Strict):
    """Sampling parameters a route applies before caching and routing."""

    defaults: dict[str, Any] = Field(default_factory=dict)  # used when the client sent none
    pinned: dict[str, Any] = Field(default_factory=dict)  # always override the client
    max: dict[str, float] = Field(default_factory=dict)  # numeric caps (clamped)
    min: dict[str, float] = Field(default_factory=dict)


class RouteCachePolicy(_Strict):
    mode: Literal["deterministic", "always", "off"] = "deterministic"
    ttl_s: float | None = Field(default=None, gt=0)


class SemanticCachePolicy(_Strict):
    """Per-route semantic cache (same question in other words -> the cached answer)."""

    enabled: bool = False
    threshold: float | None = Field(default=None, gt=0, le=1)  # verifier score; default: the shipped one
    ttl_s: float | None = Field(default=None, gt=0)  # default: the route's cache ttl, else cache.ttl_s


class TargetPolicy(_Strict):
    model: str


class TiersPolicy(_Strict):
    """A route's models by tier; the classifier picks which tier is tried first."""

    cheap: list[str] = Field(default_factory=list)
    self_hosted: list[str] = Field(default_factory=list)
    strong: list[str] = Field(default_factory=list)

    def models(self) -> list[str]:
        return list(dict.fromkeys([*self.cheap, *self.self_hosted, *self.strong]))


class ClassifierPolicy(_Strict):
    """Complexity routing. ``select: tiers`` (the default): score >= threshold -> strong tier
    first, else the cheap tier; give the threshold, or a quality target (fraction of
    strong-model quality) from which the threshold is read off the classifier's calibration
    curve. ``select: cheapest``: over the route's targets, the cheapest model whose predicted
    quality (difficulty model + the model's ability) is at least ``quality_target`` times the
    best candidate's; the others follow as fallbacks, best predicted quality first."""

    select: Literal["tiers", "cheapest"] = "tiers"
    threshold: float | None = Field(default=None, ge=0, le=1)
    quality_target: float | None = Field(default=None, gt=0, le=1)
    weights: str | None = None  # router weights file; default: the weights shipped in the package
    difficulty_weights: str | None = None  # select: cheapest; default: the shipped ones
    expected_output_tokens: int = Field(default=300, gt=0)  # select: cheapest, for the expected cost

    @model_validator(mode="after")
    def _one_of(self) -> ClassifierPolicy:
        if self.select == "cheapest":
            if self.quality_target is None or self.threshold is not None:
                raise ValueError("'select: cheapest' needs 'quality_target' (and no 'threshold')")
        elif (self.threshold is None) == (self.quality_target is None):
            raise ValueError("give exactly one of 'threshold' or 'quality_target'")
        return self


class RoutePolicy(_Strict):
    targets: list[TargetPolicy] = Field(min_length=1)
    baseline: str | None = None  # reference model for baseline cost; default: first target
    params: ParamsPolicy = Field(default_factory=ParamsPolicy)
    cache: RouteCachePolicy = Field(default_factory=RouteCachePolicy)
    semantic_cache: SemanticCachePolicy = Field(default_factory=SemanticCachePolicy)
    retries: int = Field(default=2, ge=0, le=10)  # per target, after the first attempt
    attempt_timeout_s: float = Field(default=60.0, gt=0)  # non-stream: whole call; stream: until headers
    stream_idle_timeout_s: float = Field(default=60.0, gt=0)  # stream: between chunks
    deadline_s: float = Field(default=300.0, gt=0)  # everything, retries and fallbacks included
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy)
    on_budget_exceeded: BudgetExceededPolicy = Field(default_factory=BudgetExceededPolicy)
    max_output_tokens: int | None = Field(default=None, gt=0)  # reserved when the client sends none

    tiers: TiersPolicy | None = None  # cheap / self_hosted / strong; then `targets` is derived
    classifier: ClassifierPolicy | None = None  # needs tiers
    batch: RouteBatchPolicy = Field(default_factory=RouteBatchPolicy)  # Batch API items
    compression: CompressionPolicy = Field(default_factory=CompressionPolicy)
    learn: LearnPolicy | None = None  # a learned route over the targets (no classifier)
    cascade: CascadePolicy | None = None  # cheap first target, escalate when a check fails
    shadow: ShadowPolicy | None = None  # sampled background judging that produces feedback

    @model_validator(mode="before")
    @classmethod
    def _targets_from_tiers(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("tiers") is not None:
            if v.get("targets") is not None:
                raise ValueError("give either 'targets' or 'tiers', not both")
            tiers = TiersPolicy.model_validate(v["tiers"])
            return {**v, "targets": tiers.models()}
        return v

    @model_validator(mode="after")
    def _classifier_needs_tiers(self) -> RoutePolicy:
        if self.learn is not None and (self.classifier is not None or len(self.targets) < 2):
            raise ValueError("'learn' needs two targets or more and no 'classifier'")
        if self.cascade is not None and (len(self.targets) < 2 or self.learn or self.classifier):
            raise ValueError("'cascade' needs two targets or more and neither 'learn' nor 'classifier'")
        if self.classifier is not None and self.classifier.select == "cheapest":
            if len(self.targets) < 2:
                raise ValueError("'classifier' with 'select: cheapest' needs two targets or more")
        elif self.classifier is not None:
            if self.tiers is None or not self.tiers.strong:
                raise ValueError("'classifier' needs 'tiers' with a 'strong' tier")
            if not (self.tiers.cheap or self.tiers.self_hosted):
                raise ValueError("'classifier' needs a 'cheap' or 'self_hosted' tier besides 'strong'")
        return self

    @field_validator("targets", mode="before")
    @classmethod
    def _targets_shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"model": t} if isinstance(t, str) else t for t in v]
        return v


class CachePolicy(_Strict):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    semantic_max_entries: int = Field(default=100_000, gt=0)  # per replica, oldest out first
    semantic_redis_prefix: str = "switchyard:semcache:"
    max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    ttl_s: float = Field(default=3600.0, gt=0)
    max_entry_bytes: int = Field(default=1024 * 1024, gt=0)
    redis_timeout_s: float = Field(default=0.05, gt=0)


class TenantPolicy(_Strict):
    models: list[str] = Field(default_factory=lambda: ["*"])  # routes/models allowed; "*" = all
    rpm: int | None = Field(default=None, gt=0)
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy)


class LimitsPolicy(_Strict):
    """Rate limits and budgets: shared through Redis when a URL is set (or SWITCHYARD_REDIS_URL)."""

    redis_url: str | None = None
    redis_timeout_s: float = Field(default=0.25, gt=0)
    on_redis_error: Literal["open", "closed"] = "open"  # open: fall back to the in-process limiter
    redis_prefix: str = "switchyard:limits:"
    key_rpm: int | None = Field(default=None, gt=0)  # default for keys without their own limit
    key_tpm: int | None = Field(default=None, gt=0)
    default_max_output_tokens: int = Field(default=4096, gt=0)


class TelemetryPolicy(_Strict):
    otlp_endpoint: str | None = None  # OTLP/HTTP traces URL; off when unset (or SWITCHYARD_OTLP_ENDPOINT)
    service_name: str = "switchyard"


class BreakerPolicy(_Strict):
    failure_threshold: int = Field(default=5, ge=1)
    open_seconds: float = Field(default=15.0, gt=0)


class Policy(_Strict):
    version: Literal[1] = 1
    server: ServerPolicy = Field(default_factory=ServerPolicy)
    providers: dict[str, ProviderPolicy] = Field(default_factory=dict)
    models: dict[str, ModelPolicy] = Field(default_factory=dict)
    routes: dict[str, RoutePolicy] = Field(default_factory=dict)
    # Model names clients send (globs: `claude-*`, `gpt-5*-codex`) -> a route or model; the
    # first pattern that matches wins, exact route/model names always come first.
    aliases: dict[str, str] = Field(default_factory=dict)
    allow_direct_models: bool = True
    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)
    cache: CachePolicy = Field(default_factory=CachePolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)
    limits: LimitsPolicy = Field(default_factory=LimitsPolicy)
    telemetry: TelemetryPolicy = Field(default_factory=TelemetryPolicy)
    batches: BatchesPolicy = Field(default_factory=BatchesPolicy)

    def allowed_models(self, tenant: str) -> frozenset[str] | None:
        """The routes/models a tenant may call; None means every one the policy exposes."""
        tp = self.tenants.get(tenant)
        return None if tp is None or "*" in tp.models else frozenset(tp.models)

    def cross_reference_errors(self) -> list[tuple[str, str]]:
        """(yaml path, message) for every dangling reference."""
        errors: list[tuple[str, str]] = []
        for pname, prov in self.providers.items():
            if prov.type != "openai" and (prov.replicas or prov.load is not None):
                errors.append((f"providers.{pname}", "replicas/load are for OpenAI-compatible engines"))
            if prov.responses and (prov.type != "openai" or prov.replicas):
                errors.append((f"providers.{pname}.responses", "only for type openai without replicas"))
        for name, model in self.models.items():
            if model.provider not in self.providers:
                errors.append((f"models.{name}.provider", f"unknown provider '{model.provider}'"))
        for name, route in self.routes.items():
            if name in self.models:
                errors.append((f"routes.{name}", f"route name '{name}' clashes with a model name"))
            for i, target in enumerate(route.targets):
                if target.model not in self.models:
                    errors.append((f"routes.{name}.targets[{i}].model", f"unknown model '{target.model}'"))
            kinds = {self.models[t.model].kind for t in route.targets if t.model in self.models}
            if len(kinds) > 1:
                errors.append((f"routes.{name}.targets", f"targets mix model kinds {sorted(kinds)}"))
            if route.baseline is not None and route.baseline not in self.models:
                errors.append((f"routes.{name}.baseline", f"unknown model '{route.baseline}'"))
            for part in ("candidate", "judge"):
                named = getattr(route.shadow, part, None) if route.shadow is not None else None
                if named is not None and named not in self.models:
                    errors.append((f"routes.{name}.shadow.{part}", f"unknown model '{named}'"))
            spill = route.on_budget_exceeded.spill_to
            if spill is not None and spill not in self.models and spill not in self.routes:
                where = f"routes.{name}.on_budget_exceeded.spill_to"
                errors.append((where, f"unknown route or model '{spill}'"))
        known = set(self.models) | set(self.routes)
        for tname, tenant in self.tenants.items():
            for i, m in enumerate(tenant.models):
                if m != "*" and m not in known:
                    errors.append((f"tenants.{tname}.models[{i}]", f"unknown route or model '{m}'"))
        if self.cache.backend == "redis" and not self.cache.redis_url:
            errors.append(("cache.redis_url", "required when cache.backend is 'redis'"))
        for pattern, name in self.aliases.items():
            if name not in self.routes and name not in self.models:
                errors.append((f"aliases.{pattern}", f"unknown route or model '{name}'"))
        return errors
