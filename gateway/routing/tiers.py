"""Complexity routing over a route's tiers, built from the policy: the classifier's score picks
which tier is tried first (``plan.AutoRoute``); the other tiers stay as fallbacks in a fixed order.

    score >= threshold -> "strong":       strong, cheap, self_hosted
    score <  threshold -> "self_hosted":  self_hosted, cheap, strong   (when the route has one)
                       -> "cheap":        cheap, strong                (otherwise)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.config.loader import PolicyError
from gateway.config.policy import ModelPolicy, RoutePolicy
from gateway.routing.plan import AutoRoute, Candidate, QualityRoute, RoutePlan

log = logging.getLogger("switchyard")


def build_auto(
    name: str,
    route: RoutePolicy,
    make_plan: Callable[[list[str]], RoutePlan],
    models: Mapping[str, ModelPolicy] | None = None,
) -> AutoRoute | QualityRoute | None:
    """The AutoRoute of a route with a classifier (None without one). Loads the weights file
    (small JSON; the embedding model itself loads on the first request)."""
    cfg, tiers = route.classifier, route.tiers
    where = f"routes.{name}.classifier"
    if cfg is not None and cfg.select == "cheapest":
        return _build_quality(where, route, make_plan, models or {})
    if cfg is None or tiers is None:
        return None
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


def _build_quality(
    where: str,
    route: RoutePolicy,
    make_plan: Callable[[list[str]], RoutePlan],
    models: Mapping[str, ModelPolicy],
) -> QualityRoute | None:
    """``select: cheapest``: every target with an ability and a configured provider is a candidate."""
    cfg = route.classifier
    assert cfg is not None and cfg.quality_target is not None  # the policy schema guarantees both
    try:
        from gateway.routing.classifier import ClassifierError
        from gateway.routing.quality import DifficultyModel
    except ImportError as exc:
        log.warning(
            "%s: the difficulty model needs the ml extra (pip install 'switchyard[ml]'): %s", where, exc
        )
        return None
    try:
        model = DifficultyModel.load(Path(cfg.difficulty_weights) if cfg.difficulty_weights else None)
    except ClassifierError as exc:
        raise PolicyError("policy", [(where, str(exc))]) from None
    cands: list[Candidate] = []
    for t in route.targets:
        mp = models.get(t.model)
        ability = model.ability(
            t.model, ability=mp.ability if mp else None, mmlu_pro=mp.mmlu_pro if mp else None
        )
        if ability is None:
            msg = f"model '{t.model}' has no ability: give models.{t.model}.ability or .mmlu_pro"
            raise PolicyError("policy", [(where, msg)])
        price = mp.price if mp else None
        if price is not None:
            cands.append(Candidate(t.model, ability, float(price.input), float(price.output)))
    configured = [c for c in cands if make_plan([c.model]).targets]  # a provider without a key: skipped
    if configured:  # else none is: the route answers 503 before any choice is made
        cands = configured
    if not cands:
        return None
    by_ability = [c.model for c in sorted(cands, key=lambda c: -c.ability)]
    plans = {c.model: make_plan(_unique([c.model, *by_ability])) for c in cands}
    return QualityRoute(model, cfg.quality_target, tuple(cands), cfg.expected_output_tokens, plans)


def _unique(models: list[str]) -> list[str]:
    return list(dict.fromkeys(models))
