"""Fast mock LLM upstream speaking the OpenAI and Anthropic HTTP APIs, with fault injection.

Python use (tests)::

    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=16) as mock:
        client = openai.OpenAI(base_url=mock.base_url + "/v1", api_key="x")
        mock.add_fault(kind="status", status=500)

CLI (benchmarks)::

    python -m load_tests.mock_upstream --host 127.0.0.1 --port 8001 --ttft-ms 0 --itl-ms 0 --tokens 16

See load_tests/README.md for the wire behaviour, the control API and the fault kinds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from load_tests.mock_http import MockProtocol
from load_tests.mock_router import MockApp
from load_tests.mock_state import MockState, Settings

__all__ = ["MockUpstream", "main", "new_event_loop", "start_server"]

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def start_server(state: MockState, host: str, port: int) -> tuple[asyncio.Server, set[MockProtocol]]:
    """Start listening on the running loop; returns the server and its live connections."""
    app = MockApp(state)
    connections: set[MockProtocol] = set()
    loop = asyncio.get_running_loop()
    factory: Callable[[], MockProtocol] = lambda: MockProtocol(app, connections)  # noqa: E731
    server = await loop.create_server(factory, host, port, reuse_address=True, backlog=2048)
    return server, connections


async def close_server(server: asyncio.Server, connections: set[MockProtocol]) -> None:
    server.close()
    for conn in list(connections):
        conn.close()
    for _ in range(100):  # let connection_lost callbacks run (bounded)
        if not connections:
            break
        await asyncio.sleep(0.001)
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class MockUpstream:
    """The mock server on 127.0.0.1 in a background thread with its own event loop."""

    def __init__(
        self,
        ttft_ms: float = 0.0,
        itl_ms: float = 0.0,
        tokens: int = 16,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.state = MockState(Settings(ttft_ms=float(ttft_ms), itl_ms=float(itl_ms), tokens=int(tokens)))
        self.host = host
        self.port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # lifecycle -------------------------------------------------------------
    def start(self) -> MockUpstream:
        if self._thread is not None:
            return self
        ready = threading.Event()
        errors: list[BaseException] = []
        thread = threading.Thread(target=self._run, args=(ready, errors), name="mock-upstream", daemon=True)
        thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            raise RuntimeError("mock upstream did not start in time")
        if errors:
            thread.join(_STOP_TIMEOUT_S)
            raise RuntimeError(f"mock upstream failed to start: {errors[0]!r}") from errors[0]
        self._thread = thread
        return self

    def stop(self) -> None:
        thread, loop, stopped = self._thread, self._loop, self._stopped
        if thread is None or loop is None or stopped is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stopped.set)
        thread.join(_STOP_TIMEOUT_S)
        self._thread = None
        self._loop = None
        self._stopped = None

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready, errors))
        except Exception as exc:  # surfaced by start()
            errors.append(exc)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            ready.set()

    async def _main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        self._stopped = asyncio.Event()
        try:
            server, connections = await start_server(self.state, self.host, self.port)
        except OSError as exc:
            errors.append(exc)
            return
        self.port = int(server.sockets[0].getsockname()[1])
        ready.set()
        try:
            await self._stopped.wait()
        finally:
            await close_server(server, connections)

    def __enter__(self) -> MockUpstream:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> MockUpstream:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # control -------------------------------------------------------------
    def add_fault(self, kind: str, model: str | None = None, **fields: Any) -> None:
        """Queue one fault (same as ``POST /_mock/faults``)."""
        spec: dict[str, Any] = {"kind": kind, **fields}
        if model is not None:
            spec["model"] = model
        self.state.add_faults([spec])

    def add_faults(self, faults: list[dict[str, Any]]) -> None:
        self.state.add_faults(faults)

    def faults(self) -> list[dict[str, Any]]:
        return self.state.faults()

    def clear_faults(self) -> None:
        self.state.clear_faults()

    def requests(self) -> list[dict[str, Any]]:
        """Recorded upstream requests (oldest first, last 1000): path, method, headers, body."""
        return self.state.requests()

    def clear_requests(self) -> None:
        self.state.clear_requests()

    def configure(self, **settings: Any) -> None:
        """Change ``ttft_ms``, ``itl_ms`` and/or ``tokens`` for later requests."""
        self.state.configure(**settings)

    def reset(self) -> None:
        """Forget faults, recorded requests and the Anthropic prompt-cache memory."""
        self.state.reset()


# CLI -----------------------------------------------------------------------
def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.mock_upstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=16)
    return parser.parse_args(argv)


async def _serve_forever(args: argparse.Namespace) -> None:
    state = MockState(Settings(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens))
    server, connections = await start_server(state, args.host, args.port)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on http://{args.host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await close_server(server, connections)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve_forever(args))
    except OSError as exc:
        print(f"mock upstream: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
