"""The routing policy schema (YAML). Pydantic with extra="forbid" everywhere; cross-references
(route -> model -> provider) are checked after parsing with the YAML path of each error."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerPolicy(_Strict):
    auth: Literal["keys", "none"] = "keys"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    log_prompts: bool = False


class ProviderPolicy(_Strict):
    type: Literal["openai", "anthropic"]
    base_url: str
    # Secrets: kept out of repr/str (reprs end up in logs, tracebacks and debuggers).
    api_key: str | None = Field(default=None, repr=False)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    # A provider whose key resolved to empty is skipped by the router when it needs a key.
    key_required: bool = True

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


class ModelPolicy(_Strict):
    provider: str
    upstream: str | None = None  # upstream model id; defaults to the catalog name
    kind: Literal["chat", "completions", "embeddings"] = "chat"
    price: PricePolicy
    context_window: int | None = Field(default=None, gt=0)


class ParamsPolicy(_Strict):
    """Sampling parameters a route applies before caching and routing."""

    defaults: dict[str, Any] = Field(default_factory=dict)  # used when the client sent none
    pinned: dict[str, Any] = Field(default_factory=dict)  # always override the client
    max: dict[str, float] = Field(default_factory=dict)  # numeric caps (clamped)
    min: dict[str, float] = Field(default_factory=dict)


class RouteCachePolicy(_Strict):
    mode: Literal["deterministic", "always", "off"] = "deterministic"
    ttl_s: float | None = Field(default=None, gt=0)


class TargetPolicy(_Strict):
    model: str


class RoutePolicy(_Strict):
    targets: list[TargetPolicy] = Field(min_length=1)
    baseline: str | None = None  # reference model for baseline cost; default: first target
    params: ParamsPolicy = Field(default_factory=ParamsPolicy)
    cache: RouteCachePolicy = Field(default_factory=RouteCachePolicy)
    retries: int = Field(default=2, ge=0, le=10)  # per target, after the first attempt
    attempt_timeout_s: float = Field(default=60.0, gt=0)  # non-stream: whole call; stream: until headers
    stream_idle_timeout_s: float = Field(default=60.0, gt=0)  # stream: between chunks
    deadline_s: float = Field(default=300.0, gt=0)  # everything, retries and fallbacks included

    @field_validator("targets", mode="before")
    @classmethod
    def _targets_shorthand(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"model": t} if isinstance(t, str) else t for t in v]
        return v


class CachePolicy(_Strict):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    ttl_s: float = Field(default=3600.0, gt=0)
    max_entry_bytes: int = Field(default=1024 * 1024, gt=0)
    redis_timeout_s: float = Field(default=0.05, gt=0)


class TenantPolicy(_Strict):
    models: list[str] = Field(default_factory=lambda: ["*"])  # routes/models allowed; "*" = all
    rpm: int | None = Field(default=None, gt=0)


class BreakerPolicy(_Strict):
    failure_threshold: int = Field(default=5, ge=1)
    open_seconds: float = Field(default=15.0, gt=0)


class Policy(_Strict):
    version: Literal[1] = 1
    server: ServerPolicy = Field(default_factory=ServerPolicy)
    providers: dict[str, ProviderPolicy] = Field(default_factory=dict)
    models: dict[str, ModelPolicy] = Field(default_factory=dict)
    routes: dict[str, RoutePolicy] = Field(default_factory=dict)
    allow_direct_models: bool = True
    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)
    cache: CachePolicy = Field(default_factory=CachePolicy)
    breaker: BreakerPolicy = Field(default_factory=BreakerPolicy)

    def allowed_models(self, tenant: str) -> frozenset[str] | None:
        """The routes/models a tenant may call; None means every one the policy exposes."""
        tp = self.tenants.get(tenant)
        return None if tp is None or "*" in tp.models else frozenset(tp.models)

    def cross_reference_errors(self) -> list[tuple[str, str]]:
        """(yaml path, message) for every dangling reference."""
        errors: list[tuple[str, str]] = []
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
        known = set(self.models) | set(self.routes)
        for tname, tenant in self.tenants.items():
            for i, m in enumerate(tenant.models):
                if m != "*" and m not in known:
                    errors.append((f"tenants.{tname}.models[{i}]", f"unknown route or model '{m}'"))
        if self.cache.backend == "redis" and not self.cache.redis_url:
            errors.append(("cache.redis_url", "required when cache.backend is 'redis'"))
        return errors
