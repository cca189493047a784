"""A vLLM-like engine mock for batch benchmarks: ``slots`` sequences run at once (vLLM's
``max_num_seqs``), the rest wait in arrival order; ``/metrics`` shows the waiting queue,
the running sequences and the KV cache use (running / slots) under vLLM's metric names, which
the gateway's engine probe reads (gateway/routing/engine_load.py).

A request takes ``prefill_ms`` plus ``tokens`` decode steps of ``itl_ms`` each; a step is
slower as more sequences share the engine: ``itl_ms * (1 + contention * running / slots)``
(batched decoding is close to flat until compute bound; ``contention`` says how far from flat).

    with MockEngine(slots=64) as engine:
        engine.base_url  # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from types import TracebackType
from typing import Any

from aiohttp import web


class Engine:
    def __init__(self, slots: int, prefill_ms: float, itl_ms: float, tokens: int, contention: float) -> None:
        self.slots, self.prefill_ms, self.itl_ms = slots, prefill_ms, itl_ms
        self.tokens, self.contention = tokens, contention
        self.running = 0
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.served = 0

    async def _enter(self) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(turn)
        await turn  # the slot was handed over by _leave (running already counts it)

    def _leave(self) -> None:
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.running -= 1

    async def generate(self) -> None:
        await self._enter()
        try:
            await asyncio.sleep(self.prefill_ms / 1000)
            for _ in range(self.tokens):
                step = self.itl_ms * (1 + self.contention * self.running / self.slots)
                await asyncio.sleep(step / 1000)
        finally:
            self._leave()
            self.served += 1

    def metrics(self) -> str:
        kv = self.running / self.slots
        return (
            f'vllm:num_requests_waiting{{engine="0",model_name="mock"}} {float(len(self.waiting))}\n'
            f'vllm:num_requests_running{{engine="0",model_name="mock"}} {float(self.running)}\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="mock"}} {kv}\n'
        )


def app(engine: Engine) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        await engine.generate()
        n = engine.tokens
        return web.json_response(
            {
                "id": "chatcmpl-mock",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "mock"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok " * n},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n},
            }
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=engine.metrics())

    application = web.Application()
    application.router.add_post("/v1/chat/completions", chat)
    application.router.add_get("/metrics", metrics)
    return application


class MockEngine:
    """The engine on its own thread and event loop, on a free loopback port."""

    def __init__(
        self,
        slots: int = 64,
        prefill_ms: float = 5.0,
        itl_ms: float = 2.0,
        tokens: int = 16,
        contention: float = 0.1,
    ) -> None:
        self.engine = Engine(slots, prefill_ms, itl_ms, tokens, contention)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mock-engine", daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> None:
        self._runner = web.AppRunner(app(self.engine), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]

    def __enter__(self) -> MockEngine:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def main(argv: list[str] | None = None) -> int:
    """Serve until killed; prints the port on the first line of stdout."""
    import argparse
    import sys

    p = argparse.ArgumentParser(description="vLLM-like engine mock (slots, waiting queue, /metrics)")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--prefill-ms", type=float, default=5.0)
    p.add_argument("--itl-ms", type=float, default=2.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--contention", type=float, default=0.1)
    a = p.parse_args(argv)
    with MockEngine(a.slots, a.prefill_ms, a.itl_ms, a.tokens, a.contention) as engine:
        sys.stdout.write(f"{engine.port}\n")
        sys.stdout.flush()
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
