"""Shared, thread-safe state of a mock upstream: settings, fault queue, request log.

The server's event loop thread and the test thread both touch this object, so every
operation takes one short lock. Nothing here does I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

FAULT_KINDS = frozenset(
    {
        "status",
        "stall",
        "stall_mid_stream",
        "cut_mid_stream",
        "malformed_sse",
        "malformed_json",
        "wrong_content_type",
        "reset",
        "huge",
    }
)
MAX_RECORDED = 1000
MAX_IDEMPOTENT = 200_000  # answers kept by Idempotency-Key (oldest dropped first)
MAX_FAULTS = 10_000
_INT_FIELDS = ("status", "after_chunks", "bytes", "times")
_NUM_FIELDS = ("seconds", "retry_after")


class FaultError(ValueError):
    """A fault spec that cannot be queued (unknown kind, bad field)."""


@dataclass(frozen=True)
class Settings:
    """Defaults applied to every request: latency knobs and reply length in words."""

    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens: int = 16


def validate_fault(spec: dict[str, Any]) -> dict[str, Any]:
    """Check one fault spec and return a normalised copy (``times`` defaults to 1)."""
    if not isinstance(spec, dict):
        raise FaultError("a fault must be a JSON object")
    kind = spec.get("kind")
    if kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
    out = dict(spec)
    for name in _INT_FIELDS:
        if name in out and (not isinstance(out[name], int) or isinstance(out[name], bool) or out[name] < 0):
            raise FaultError(f"fault field {name!r} must be a non-negative integer")
    for name in _NUM_FIELDS:
        if name in out and (not isinstance(out[name], int | float) or out[name] < 0):
            raise FaultError(f"fault field {name!r} must be a non-negative number")
    if kind == "status" and not 100 <= int(out.get("status", 0)) <= 599:
        raise FaultError("status fault needs 'status' between 100 and 599")
    model = out.get("model")
    if model is not None and not isinstance(model, str):
        raise FaultError("fault field 'model' must be a string or null")
    out["times"] = int(out.get("times", 1))
    return out


class MockState:
    """Settings, FIFO fault queue, request log and the Anthropic prompt-cache memory."""

    def __init__(self, settings: Settings) -> None:
        self._lock = threading.Lock()
        self._settings = settings
        self._faults: list[dict[str, Any]] = []
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._seen_prefixes: set[str] = set()
        self.served = 0
        self._by_key: dict[str, Any] = {}  # Idempotency-Key -> the first answer's plan
        self.replayed = 0  # requests answered from _by_key (served, but not run again)

    # settings -------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        return self._settings

    def configure(self, **changes: Any) -> Settings:
        allowed = {"ttft_ms", "itl_ms", "tokens"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"unknown setting(s): {sorted(unknown)}")
        current = self._settings
        new = Settings(
            ttft_ms=float(changes.get("ttft_ms", current.ttft_ms)),
            itl_ms=float(changes.get("itl_ms", current.itl_ms)),
            tokens=int(changes.get("tokens", current.tokens)),
        )
        if new.ttft_ms < 0 or new.itl_ms < 0 or new.tokens < 1:
            raise ValueError("ttft_ms/itl_ms must be >= 0 and tokens >= 1")
        with self._lock:
            self._settings = new
            return new

    # faults ---------------------------------------------------------------
    def add_faults(self, specs: list[dict[str, Any]]) -> int:
        checked = [validate_fault(s) for s in specs]
        with self._lock:
            if len(self._faults) + len(checked) > MAX_FAULTS:
                raise FaultError(f"fault queue is limited to {MAX_FAULTS} entries")
            self._faults.extend(checked)
            return len(self._faults)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(f) for f in self._faults]

    def pop_fault(self, model: str | None) -> dict[str, Any] | None:
        """Take the first queued fault for this model (or for any model)."""
        if not self._faults:  # cheap unlocked peek for the hot path
            return None
        with self._lock:
            for i, fault in enumerate(self._faults):
                wanted = fault.get("model")
                if wanted is None or wanted == model:
                    if fault["times"] <= 1:
                        del self._faults[i]
                    else:
                        fault["times"] -= 1
                    return fault
        return None

    # request log ----------------------------------------------------------
    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._requests.append(entry)
            self.served += 1

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # Idempotency-Key -----------------------------------------------------
    def replay(self, key: str) -> Any:
        """The answer first given under ``key`` (counted as a replay), or None."""
        with self._lock:
            first = self._by_key.get(key)
            if first is not None:
                self.replayed += 1
            return first

    def remember(self, key: str, plan: Any) -> None:
        with self._lock:
            if len(self._by_key) >= MAX_IDEMPOTENT:
                del self._by_key[next(iter(self._by_key))]
            self._by_key.setdefault(key, plan)

    @property
    def executions(self) -> int:
        """Requests that ran (``served`` less the Idempotency-Key replays)."""
        return self.served - self.replayed

    # Anthropic prompt cache ----------------------------------------------
    def cache_lookup(self, prefix: str) -> bool:
        """True if this cacheable prefix was seen before; remembers it either way."""
        with self._lock:
            if prefix in self._seen_prefixes:
                return True
            self._seen_prefixes.add(prefix)
            return False

    def reset(self) -> None:
        """Forget faults, recorded requests and the prompt-cache memory."""
        with self._lock:
            self._faults.clear()
            self._requests.clear()
            self._seen_prefixes.clear()
            self._by_key.clear()
