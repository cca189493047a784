"""The pass-through floor: a bare aiohttp reverse proxy in front of the mock upstream.

    python -m load_tests.bench_floor --upstream http://127.0.0.1:8001 [--port 0] [--client h1]

It does what any HTTP gateway must do and nothing else (read the request, forward its body
with the upstream's key over a pooled keep-alive connection, relay the status, content type
and body, streaming chunks as they arrive): no auth, validation, routing, cache, ledger or
metrics. ``--client h1`` forwards complete (non-stream) requests with the gateway's own
unary client (``gateway/providers/h1.py``) instead of aiohttp's: the floor of this design,
stricter than the issue's aiohttp one. ``load_tests.bench`` runs it on the gateway's core,
so "gateway req/s / floor req/s" says how much of the achievable throughput the gateway's
own work leaves. Prints
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

from gateway.providers.h1 import H1Pool
from load_tests.mock_upstream import new_event_loop

UPSTREAM_KEY = "mock-key"
_PASSED = ("content-type",)


def make_app(upstream: str, client: str = "aiohttp") -> web.Application:
    app = web.Application()
    session_key = web.AppKey("session", aiohttp.ClientSession)
    pool = H1Pool(upstream) if client == "h1" else None

    async def on_startup(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        app[session_key] = aiohttp.ClientSession(upstream, connector=connector, auto_decompress=False)

    async def on_cleanup(app: web.Application) -> None:
        await app[session_key].close()
        if pool is not None:
            await pool.aclose()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"authorization": f"Bearer {UPSTREAM_KEY}", "content-type": "application/json"}
        if pool is not None and b'"stream":true' not in body.replace(b" ", b""):
            got = await pool.post(request.path, body, headers, 32 * 1024 * 1024)
            ctype = got.headers.get("content-type", "application/json")
            return web.Response(status=got.status, body=got.body or b"", headers={"content-type": ctype})
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


async def _serve(upstream: str, host: str, port: int, client: str) -> None:
    runner = web.AppRunner(make_app(upstream, client), access_log=None, handle_signals=False)
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
    p.add_argument("--client", choices=("aiohttp", "h1"), default="aiohttp", help="upstream client")
    args = p.parse_args(argv)
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(args.upstream, args.host, args.port, args.client))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
