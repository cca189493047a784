"""The learned route's state and settings: per (task, model) evidence, a task's counters, an
estimate, and the route's ``learn:`` settings (``learned.py`` decides from them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

Z_PLAN: Final = 1.0  # one-sided confidence of the route's margin (about 84%)


@dataclass(frozen=True, slots=True)
class LearnSettings:
    quality_target: float = 0.95
    task_floor: float = 0.85
    prior_strength: float = 12.0  # most pseudo-observations the additive prior is worth
    warmup: int = 3  # observations per model over the route before the bound-driven exploration
    explore_share: float = 0.02  # of a task's requests (past two); 2.5x for cheaper candidates
    reference_share: float = 0.02  # of requests serving the model that could be the best single one
    max_explore_obs: int = 200  # a model needs no more observations on a task than this
    replan_every: int = 8  # observations between two plans (and at every new task)
    z: float = Z_PLAN


@dataclass(slots=True)
class Arm:
    n: float = 0.0  # observations (feedback received)
    s: float = 0.0  # sum of scores
    cost_n: int = 0
    cost_sum: float = 0.0


@dataclass(slots=True)
class TaskState:
    requests: int = 0  # requests decided (served), labelled or not
    explored: int = 0
    arms: dict[str, Arm] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    mean: float
    sd: float
    n: float
    cost: float
    shared: float = 0.0  # the part of sd from the model's route-wide centre, shared by its tasks
