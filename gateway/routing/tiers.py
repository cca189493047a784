"""Complexity routing over a route's tiers, built from the policy: the classifier's score picks
which tier is tried first (``plan.AutoRoute``); the other tiers stay as fallbacks in a fixed order.

    score >= threshold -> "strong":       strong, cheap, self_hosted
    score <  threshold -> "self_hosted":  self_hosted, cheap, strong   (when the route has one)
                       -> "cheap":        cheap, strong                (otherwise)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from gateway.config.loader import PolicyError
from gateway.config.policy import RoutePolicy
from gateway.routing.plan import AutoRoute, RoutePlan

log = logging.getLogger("switchyard")


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
