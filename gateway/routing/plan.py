"""What a route resolves to: the ordered targets (``RoutePlan``) and, for routes with a
complexity classifier, the tier orders the score chooses between (``AutoRoute``, built by
``tiers.build_auto``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config.policy import RoutePolicy
from gateway.core.types import Target

if TYPE_CHECKING:
    from gateway.routing.classifier import ComplexityClassifier

log = logging.getLogger("switchyard")
UNSCORED = "unscored"  # route_decision when no score could be computed (no user text, no embedder)


class EmbedderLike(Protocol):
    """What routing needs of the shared embedder (gateway.cache.embedder.Embedder)."""

    name: str
    dim: int

    async def embed(self, text: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class Choice:
    plan: RoutePlan
    tier: str  # "strong" | "cheap" | "self_hosted" | "unscored"
    score: float | None


@dataclass(frozen=True, slots=True)
class AutoRoute:
    classifier: ComplexityClassifier
    threshold: float
    strong_first: RoutePlan
    low_first: RoutePlan
    low_tier: str  # "cheap" | "self_hosted"

    def decide(self, score: float) -> tuple[RoutePlan, str]:
        """The plan to run for a prompt with this score, and the tier tried first."""
        if score >= self.threshold:
            return self.strong_first, "strong"
        return self.low_first, self.low_tier

    async def choose(
        self, fallback: RoutePlan, text: str | None, vector: Any, embedder: Callable[[], Any]
    ) -> Choice:
        """Score ``text`` (reusing ``vector`` when the semantic cache already embedded it, else
        embedding it with the shared embedder) and pick the tier to try first. Any failure to
        score keeps the route's default order (``fallback``) and is logged, never raised."""
        if not text:
            return Choice(fallback, UNSCORED, None)
        try:
            if vector is None:
                emb: EmbedderLike = await embedder()
                self.classifier.check_embedder(getattr(emb, "space", emb.name), emb.dim)
                vector = await emb.embed(text)
            score = self.classifier.score(vector, text)
        except Exception:  # the request goes on with the default order
            log.exception("complexity classifier failed; using the route's default order")
            return Choice(fallback, UNSCORED, None)
        plan, tier = self.decide(score)
        return Choice(plan, tier, score)


@dataclass(frozen=True, slots=True)
class RoutePlan:
    name: str  # the route name, or the model name when a catalog model is called directly
    kind: str  # chat | completions | embeddings
    targets: tuple[Target, ...]  # configured targets, in fallback order
    unconfigured: tuple[str, ...]  # providers skipped because their key is not set
    baseline: Target | None
    policy: RoutePolicy
    is_route: bool
    auto: AutoRoute | None = None  # complexity routing over tiers (routes with a classifier)
