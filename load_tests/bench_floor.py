"""The pass-through floor: a bare aiohttp reverse proxy in front of the mock upstream.

    python -m load_tests.bench_floor --upstream http://127.0.0.1:8001 [--port 0]

It does what any HTTP gateway must do and nothing else (read the request, forward its body
with the upstream's key over a pooled keep-alive connection, relay the status, content type
and body, streaming chunks as they arrive): no auth, validation, routing, cache, ledger or
metrics. ``load_tests.bench`` runs it on the gateway's core, so "gateway req/s / floor req/s"
says how much of the achievable throughput the gateway's own work leaves. Prints
``listening on http://HOST:PORT`` once ready; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

import aiohttp
from aiohttp import web

from load_tests.mock_upstream import new_event_loop

UPSTREAM_KEY = "mock-key"
_PASSED = ("content-type",)


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def on_startup(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        app[session_key] = aiohttp.ClientSession(upstream, connector=connector, auto_decompress=False)

    async def on_cleanup(app: web.Application) -> None:
        await app[session_key].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"authorization": f"Bearer {UPSTREAM_KEY}", "content-type": "application/json"}
        async with app[session_key].post(request.path, data=body, headers=headers) as up:
            passed = {k: up.headers[k] for k in _PASSED if k in up.headers}
            if up.headers.get("content-type", "").startswith("text/event-stream"):
                out = web.StreamResponse(status=up.status, headers=passed)
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
            return web.Response(status=up.status, body=await up.read(), headers=passed)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/chat/completions", proxy)
    return app


async def _serve(upstream: str, host: str, port: int) -> None:
    runner = web.AppRunner(make_app(upstream), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    print(f"listening on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.bench_floor", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, help="the mock's base URL, e.g. http://127.0.0.1:8001")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(args.upstream, args.host, args.port))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
