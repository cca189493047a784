"""Choose an engine replica per request: prefix affinity by consistent hashing with bounded
load (requests that share a prompt prefix land on the replica whose KV cache already holds
it, unless that replica already carries more than load_factor x the mean), least-loaded, or
round-robin. Dead replicas are skipped (a breaker per replica, plus the load probe)."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable
from typing import Any, Literal

from gateway.routing.breaker import CircuitBreaker

Mode = Literal["prefix_affinity", "least_loaded", "round_robin"]
VNODES = 64  # ring points per replica


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text contributes to the prefix
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def prefix_fingerprint(body: dict[str, Any], prefix_chars: int) -> int | None:
    """A hash of the prompt's leading ``prefix_chars`` characters as the chat template renders
    them (role, then content, message by message): the system prompt and shared context that
    fill the first KV blocks. None when the prompt is shorter (nothing worth keeping together)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        size = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            piece = f"<{m.get('role', '')}>\n{_text(m.get('content'))}\n"
            parts.append(piece)
            size += len(piece)
            if size >= prefix_chars:
                break
        rendered = "".join(parts)
    elif isinstance(body.get("prompt"), str):
        rendered = body["prompt"]
    else:
        return None
    if len(rendered) < prefix_chars:
        return None
    return _hash64(rendered[:prefix_chars].encode("utf-8", "surrogatepass"))


class HashRing:
    def __init__(self, replicas: list[str], vnodes: int = VNODES) -> None:
        points = sorted(
            (_hash64(f"{url}#{v}".encode()), i) for i, url in enumerate(replicas) for v in range(vnodes)
        )
        self._keys = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self.size = len(replicas)

    def walk(self, key: int) -> list[int]:
        """Replicas in ring order starting at ``key``, each once."""
        start = bisect.bisect_left(self._keys, key)
        seen: list[int] = []
        n = len(self._keys)
        for j in range(n):
            owner = self._owners[(start + j) % n]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == self.size:
                    break
        return seen


class ReplicaBalancer:
    """Per-engine replica choice. ``available(url)`` reports the load probe's view (a replica
    seen down or saturated is tried only after the others)."""

    def __init__(
        self,
        replicas: list[str],
        mode: Mode = "prefix_affinity",
        *,
        prefix_chars: int = 1024,
        load_factor: float = 1.25,
        available: Callable[[str], bool] | None = None,
        failure_threshold: int = 3,
        open_seconds: float = 10.0,
    ) -> None:
        self.replicas = list(replicas)
        self.mode = mode
        self.prefix_chars = prefix_chars
        self.load_factor = load_factor
        self._available = available
        self._ring = HashRing(self.replicas)
        self.in_flight = [0] * len(self.replicas)
        self.breakers = [CircuitBreaker(failure_threshold, open_seconds) for _ in self.replicas]
        self._next = 0

    def _usable(self, i: int) -> bool:
        if self.breakers[i].state == "open":
            return False
        return self._available is None or self._available(self.replicas[i])

    def order(self, body: dict[str, Any]) -> list[int]:
        """Replicas to try, best first: usable ones by the mode's rule, then the rest."""
        n = len(self.replicas)
        if n == 1:
            return [0]
        usable = [i for i in range(n) if self._usable(i)]
        pool = usable or list(range(n))
        first: int | None = None
        if self.mode == "round_robin":
            first = pool[self._next % len(pool)]
            self._next += 1
        elif self.mode == "prefix_affinity":
            key = prefix_fingerprint(body, self.prefix_chars)
            if key is not None:
                first = self._bounded(key, pool)
        if first is None:
            first = min(pool, key=lambda i: (self.in_flight[i], i))
        rest = sorted((i for i in pool if i != first), key=lambda i: self.in_flight[i])
        return [first, *rest, *(i for i in range(n) if i not in pool)]

    def _bounded(self, key: int, pool: list[int]) -> int:
        """Consistent hashing with bounded loads: the first replica on the ring (from the key)
        whose in-flight count stays within load_factor x the mean after taking this request."""
        cap = math.ceil(self.load_factor * (sum(self.in_flight[i] for i in pool) + 1) / len(pool))
        allowed = set(pool)
        walk = [i for i in self._ring.walk(key) if i in allowed]
        for i in walk:
            if self.in_flight[i] + 1 <= cap:
                return i
        return walk[0]

    def acquire(self, i: int) -> None:
        self.in_flight[i] += 1

    def release(self, i: int, ok: bool | None) -> None:
        """``ok``: True/False when the replica answered/failed at the transport level; None when
        the outcome says nothing about the replica's health."""
        self.in_flight[i] = max(0, self.in_flight[i] - 1)
        if ok is True:
            self.breakers[i].success()
        elif ok is False:
            self.breakers[i].failure()
