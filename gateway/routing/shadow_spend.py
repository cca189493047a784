"""What a route's served answers and its shadow evaluations cost (in this process), and its
sampling draws: the shadow evaluation's spend cap (gateway/flow/shadow.py). Kept on Services,
so it survives policy reloads."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from decimal import Decimal


@dataclass
class ShadowSpend:
    served: dict[str, Decimal] = field(default_factory=dict)
    shadow: dict[str, Decimal] = field(default_factory=dict)
    rng: dict[str, random.Random] = field(default_factory=dict)

    def add_served(self, route: str, cost: Decimal) -> None:
        self.served[route] = self.served.get(route, Decimal(0)) + cost

    def add_shadow(self, route: str, cost: Decimal) -> None:
        self.shadow[route] = self.shadow.get(route, Decimal(0)) + cost

    def sample(self, route: str, share: float, cap_share: float, seed: int | None) -> bool:
        """Draw for one answered request: sampled, and the shadow spend within its cap."""
        rng = self.rng.setdefault(route, random.Random(seed))
        if rng.random() >= share:
            return False
        cap = self.served.get(route, Decimal(0)) * Decimal(str(cap_share))
        return self.shadow.get(route, Decimal(0)) <= cap
