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
    from gateway.routing.quality import DifficultyModel, Prediction

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
class Candidate:
    model: str
    ability: float
    input_price: float  # USD per 1M tokens
    output_price: float


@dataclass(frozen=True, slots=True)
class QualityRoute:
    """Routing over N models (``classifier.select: cheapest``, built by ``tiers.build_auto``):
    the cheapest candidate whose predicted quality is within the quality target of the best
    candidate's goes first, the others follow best predicted quality first (in one dimension
    that is highest ability first, whatever the prompt, so the plans are built once)."""

    model: DifficultyModel
    quality_target: float
    candidates: tuple[Candidate, ...]
    expected_output_tokens: int
    plans: dict[str, RoutePlan]  # chosen model -> its plan (chosen, then by ability)

    def predict(self, vector: Any, text: str) -> tuple[float, list[Prediction]]:
        """(difficulty, one prediction per candidate) for a prompt."""
        from gateway.routing.quality import Prediction

        d = self.model.difficulty(vector, text)
        tokens_in = len(text) / 4.0  # a cheap estimate: the price ratio matters, not the count
        return d, [
            Prediction(
                c.model,
                self.model.success(d, c.ability),
                (tokens_in * c.input_price + self.expected_output_tokens * c.output_price) / 1e6,
            )
            for c in self.candidates
        ]

    def decide(self, vector: Any, text: str) -> tuple[RoutePlan, str, float, list[Prediction]]:
        from gateway.routing.quality import choose

        d, preds = self.predict(vector, text)
        best = choose(preds, self.quality_target)
        return self.plans[best.model], best.model, d, preds

    async def choose(
        self, fallback: RoutePlan, text: str | None, vector: Any, embedder: Callable[[], Any]
    ) -> Choice:
        """As AutoRoute.choose; the decision recorded is the chosen model, the score the
        prompt's difficulty."""
        if not text:
            return Choice(fallback, UNSCORED, None)
        try:
            if vector is None:
                emb: EmbedderLike = await embedder()
                self.model.check_embedder(getattr(emb, "space", emb.name), emb.dim)
                vector = await emb.embed(text)
            plan, model, d, _ = self.decide(vector, text)
        except Exception:  # the request goes on with the default order
            log.exception("difficulty model failed; using the route's default order")
            return Choice(fallback, UNSCORED, None)
        return Choice(plan, model, d)


@dataclass(frozen=True, slots=True)
class RoutePlan:
    name: str  # the route name, or the model name when a catalog model is called directly
    kind: str  # chat | completions | embeddings
    targets: tuple[Target, ...]  # configured targets, in fallback order
    unconfigured: tuple[str, ...]  # providers skipped because their key is not set
    baseline: Target | None
    policy: RoutePolicy
    is_route: bool
    auto: AutoRoute | QualityRoute | None = None  # complexity routing (routes with a classifier)
