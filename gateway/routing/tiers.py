"""Complexity routing over a route's tiers: the classifier's score picks which tier is tried
first; the other tiers stay as fallbacks in a fixed order.

    score >= threshold -> "strong":       strong, cheap, self_hosted
    score <  threshold -> "self_hosted":  self_hosted, cheap, strong   (when the route has one)
                       -> "cheap":        cheap, strong                (otherwise)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config.loader import PolicyError
from gateway.config.policy import RoutePolicy

if TYPE_CHECKING:
    from gateway.routing.classifier import ComplexityClassifier
    from gateway.routing.router import RoutePlan


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


def build_auto(
    name: str, route: RoutePolicy, make_plan: Callable[[list[str]], RoutePlan]
) -> AutoRoute | None:
    """The AutoRoute of a route with a classifier (None without one). Loads the weights file
    (small JSON; the embedding model itself loads on the first request)."""
    cfg, tiers = route.classifier, route.tiers
    if cfg is None or tiers is None:
        return None
    where = f"routes.{name}.classifier"
    try:  # numpy comes with the `ml` extra; routes without a classifier never import it
        from gateway.routing.classifier import ClassifierError, ComplexityClassifier
    except ImportError as exc:  # the route still serves, in its tier order (cheap first)
        log.warning("%s: the classifier needs the ml extra (pip install 'switchyard[ml]'): %s", where, exc)
        return None
    try:
        classifier = ComplexityClassifier.load(Path(cfg.weights) if cfg.weights else None)
        if cfg.threshold is not None:
            threshold = cfg.threshold
        else:
            assert cfg.quality_target is not None  # the policy schema guarantees one of the two
            threshold = classifier.threshold_for_quality(cfg.quality_target)
    except ClassifierError as exc:
        raise PolicyError("policy", [(where, str(exc))]) from None
    low_tier = "self_hosted" if tiers.self_hosted else "cheap"
    strong = make_plan(_unique([*tiers.strong, *tiers.cheap, *tiers.self_hosted]))
    low = make_plan(_unique([*tiers.self_hosted, *tiers.cheap, *tiers.strong]))
    return AutoRoute(classifier, threshold, strong, low, low_tier)


def _unique(models: list[str]) -> list[str]:
    return list(dict.fromkeys(models))
