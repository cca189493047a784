"""``@record``: an immutable value type, as type checkers see it, that is cheap to build.

A ``@dataclass(frozen=True, slots=True)`` pays for its immutability in every constructor: the
generated ``__init__`` sets each field through ``object.__setattr__`` (a frozen class's own
``__setattr__`` refuses), where a plain slots class's ``self.x = x`` is one specialised
bytecode. On the request path that adds up: a ledger row (28 fields) took ~7 µs frozen and
~1.8 µs plain here, and a miss builds nine such records (an ad-hoc ``timeit``; the repo's
measure is ``python -m load_tests.bench_compare``).

``record`` declares the class frozen to mypy and pyright (``dataclass_transform`` with
``frozen_default``: assigning a field is a type error, which ``mypy --strict`` on ``gateway/``
enforces) and builds it at run time as a plain slots dataclass with a field hash
(``unsafe_hash``: equal records hash alike, as frozen ones do). Use it for the per-request
records; keep ``@dataclass(frozen=True)`` where run-time immutability is worth the cost.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[_T]) -> type[_T]:
    """See the module docstring."""
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)
