"""One OpenAI-compatible engine served by several identical replicas (vLLM servers).

Each request asks a chooser (the balancer, wired in by the runtime) for the replicas in order of
preference and goes to the first; when that one cannot be reached (connection refused or
dropped before an answer) the next is tried, so a dead replica costs no request."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gateway.core.errors import UpstreamError
from gateway.core.types import ChatResult, ChatStream, RawResult, Target, Usage
from gateway.providers.openai_compat import OpenAICompatProvider

T = TypeVar("T")
UNREACHABLE = frozenset({"upstream_connect_error", "upstream_disconnected"})


def _server_error(exc: UpstreamError) -> bool:
    return exc.upstream_status is not None and exc.upstream_status >= 500


class ReplicaChooser(Protocol):
    def order(self, body: dict[str, Any]) -> list[int]: ...

    def acquire(self, i: int) -> None: ...

    def release(self, i: int, ok: bool | None) -> None: ...


class ReplicatedProvider:
    def __init__(self, name: str, replicas: list[OpenAICompatProvider], chooser: ReplicaChooser) -> None:
        self.name = name
        self.replicas = replicas
        self.chooser = chooser

    def __repr__(self) -> str:
        return f"ReplicatedProvider(name={self.name!r}, replicas={len(self.replicas)})"

    async def _pick(
        self, body: dict[str, Any], fn: Callable[[OpenAICompatProvider], Awaitable[T]]
    ) -> tuple[T, int]:
        """Call ``fn`` on replicas in the chooser's order until one answers (an unreachable
        replica passes the call on). The replica stays acquired: the caller releases it."""
        order = self.chooser.order(body)
        for n, i in enumerate(order):
            self.chooser.acquire(i)
            try:
                return await fn(self.replicas[i]), i
            except UpstreamError as exc:
                unreachable = exc.code in UNREACHABLE
                self.chooser.release(i, False if unreachable or _server_error(exc) else None)
                if unreachable and n + 1 < len(order):
                    continue
                raise
            except BaseException:
                self.chooser.release(i, None)
                raise
        raise AssertionError("unreachable: order() returned no replica")

    async def _call(self, body: dict[str, Any], fn: Callable[[OpenAICompatProvider], Awaitable[T]]) -> T:
        value, i = await self._pick(body, fn)
        self.chooser.release(i, True)
        return value

    async def chat(self, body: dict[str, Any], target: Target, timeout: float) -> ChatResult:
        return await self._call(body, lambda p: p.chat(body, target, timeout))

    async def completions(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        return await self._call(body, lambda p: p.completions(body, target, timeout))

    async def embeddings(self, body: dict[str, Any], target: Target, timeout: float) -> RawResult:
        return await self._call(body, lambda p: p.embeddings(body, target, timeout))

    async def chat_stream(
        self, body: dict[str, Any], target: Target, timeout: float, idle_timeout: float
    ) -> ChatStream:
        stream, i = await self._pick(body, lambda p: p.chat_stream(body, target, timeout, idle_timeout))
        return _ReleasingStream(stream, functools.partial(self.chooser.release, i))

    async def aclose(self) -> None:
        for p in self.replicas:
            await p.aclose()


class _ReleasingStream:
    """A replica's stream that gives its in-flight slot back exactly once, however it ends."""

    def __init__(self, inner: ChatStream, release: Callable[[bool | None], None]) -> None:
        self._inner = inner
        self._release: Callable[[bool | None], None] | None = release

    @property
    def usage(self) -> Usage | None:
        return self._inner.usage

    @usage.setter
    def usage(self, value: Usage | None) -> None:
        self._inner.usage = value

    def _done(self, ok: bool | None) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(ok)

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        ok: bool | None = None
        try:
            async for chunk in self._inner:
                yield chunk
            ok = True
        finally:
            self._done(ok)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._done(None)
