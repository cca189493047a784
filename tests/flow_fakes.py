"""In-memory parts for the request flow's ports (gateway/core/ports.py): a ``Services`` over
them is a few lines, so the flow's functions get unit tests beside the real-server ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.cache.exact import MemoryCache
from gateway.config.policy import Policy
from gateway.config.settings import Settings
from gateway.core.ledger_row import LedgerRow
from gateway.core.types import ChatResult, RawResult, RequestFacts, Target, Usage
from gateway.flow.services import Services, TaskOwner
from gateway.limits.gate import Limits
from gateway.limits.key_cache import KeyCache
from gateway.limits.keys import KeyStore
from gateway.routing.breaker import BreakerBoard
from gateway.routing.engine_load import EngineBoard
from gateway.routing.router import Router
from gateway.telemetry.metrics import Metrics

POLICY = {
    "providers": {"up": {"type": "openai", "base_url": "http://127.0.0.1:9", "key_required": False}},
    "models": {
        "small": {"provider": "up", "price": {"input": "1", "output": "2"}},
        "large": {"provider": "up", "price": {"input": "10", "output": "30"}},
    },
    "routes": {"r": {"targets": ["small"], "baseline": "large", "cache": {"mode": "always"}}},
    "tenants": {"t": {"budget": {"daily_usd": "5"}}},
}


class FakeLedger:
    """The Ledger port in memory: rows in a list, commits resolved at once."""

    def __init__(self) -> None:
        self.rows: list[LedgerRow] = []

    def start(self) -> None: ...

    def submit(self, row: LedgerRow) -> Awaitable[bool]:
        self.rows.append(row)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def pending(self) -> int:
        return 0

    def outbox_rows(self) -> int:
        return 0

    def healthy(self) -> bool:
        return True

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        return {}

    def close(self, timeout: float = 10.0) -> None: ...


@dataclass
class FakeStream:
    chunks: list[dict[str, Any]]
    usage: Usage | None = None
    closed: bool = False

    async def _gen(self) -> AsyncIterator[dict[str, Any]]:
        for chunk in self.chunks:
            yield chunk

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._gen()

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class FakeProvider:
    """The Provider port: answers every chat with ``text`` and the given usage."""

    name: str = "up"
    text: str = "hello"
    usage: Usage = field(default_factory=lambda: Usage(input_tokens=1000, output_tokens=500))
    calls: list[dict[str, Any]] = field(default_factory=list)

    def completion(self, target: Target) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": target.upstream_model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": self.text}, "finish_reason": "stop"}
            ],
            "usage": self.usage.to_openai(),
        }

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        self.calls.append(body)
        return ChatResult(self.completion(target), self.usage)

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> FakeStream:
        self.calls.append(body)
        base = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": target.upstream_model,
        }
        chunks = [
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            },
            *(
                {**base, "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]}
                for c in self.text
            ),
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**base, "choices": [], "usage": self.usage.to_openai()},
        ]
        return FakeStream(chunks, self.usage)

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        raise NotImplementedError

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        raise NotImplementedError

    async def aclose(self) -> None: ...


class FakeTracer:
    def __init__(self) -> None:
        self.facts: list[RequestFacts] = []

    def record(self, facts: RequestFacts) -> None:
        self.facts.append(facts)

    def shutdown(self) -> None: ...


class NoSemantic:
    """The SemanticLookup port for policies without a semantic route."""

    async def lookup(
        self, policy: Any, route: str, tenant: str, body: dict[str, Any], protocol: str = "chat"
    ) -> None:
        return None

    def store(self, result: Any, payload: bytes, ttl: float) -> None: ...

    async def embedder(self) -> Any:
        raise AssertionError("no route here embeds")

    async def warm(self, policy: Any) -> None: ...

    async def aclose(self) -> None: ...


def services(tmp: Path, policy: dict[str, Any] | None = None, **parts: Any) -> Services:
    """A ``Services`` over in-memory parts (override any with keyword arguments)."""
    pol = Policy.model_validate(policy or POLICY)
    tasks = TaskOwner()
    settings = Settings(home=tmp, policy_path=tmp / "policy.yaml", admin_key=None,
                        ledger_url="none", redis_url=None, log_level="warning")  # fmt: skip
    base: dict[str, Any] = {
        "settings": settings,
        "policy": pol,
        "router": Router(pol),
        "providers": {"up": FakeProvider()},
        "cache": MemoryCache(1 << 20, 1 << 16),
        "semantic": NoSemantic(),
        "limits": Limits(spawn=tasks.spawn),
        "ledger": FakeLedger(),
        "keys": KeyCache(KeyStore(tmp / "keys.db")),
        "metrics": Metrics(),
        "breakers": BreakerBoard(pol.breaker.failure_threshold, pol.breaker.open_seconds),
        "engines": EngineBoard(),
        "tasks": tasks,
        "tracer": FakeTracer(),
    }
    return Services(**{**base, **parts})
