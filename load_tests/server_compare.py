"""What does the HTTP server core cost per request? uvicorn + ASGI (the gateway's) vs aiohttp's.

`python -m load_tests.server_compare [--runs 3] [--seconds 4] [--out DIR]` starts, in turn
and alternated, three servers pinned to CPU 0 that do the least a gateway does per request
(read the JSON body, parse it, answer a fixed ~300-byte completion, no upstream call):

- ``aiohttp``: an aiohttp web app (what the pass-through floor runs on);
- ``uvicorn-asgi``: a bare ASGI callable under uvicorn with uvloop and httptools (the
  gateway's server settings, ``switchyard serve``);
- ``uvicorn-starlette``: the same with Starlette's ``Request`` and ``Response`` objects, as the
  gateway's fast path (``gateway/api/fastpath.py``) uses them;

and drives each from CPU 1 with 32 clients in a closed loop. Reports req/s and server CPU per
request (user + system from /proc, medians of the runs): the part of the gateway's cost that
is the server core, not the gateway's own work. JSON + Markdown to DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
from typing import Any

import orjson

from load_tests.bench_itemize import closed_loop_cpu
from load_tests.bench_procs import ListeningProcess, machine_info
from load_tests.report_files import bench_parser, save_report

MODES = ("aiohttp", "uvicorn-asgi", "uvicorn-starlette")
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "mock-small",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }
)
JSON_HEADERS = [(b"content-type", b"application/json")]


# ----------------------------------------------------------------------------- the servers
async def _asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    orjson.loads(b"".join(parts))
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


async def _starlette(scope: dict[str, Any], receive: Any, send: Any) -> None:
    from starlette.requests import Request
    from starlette.responses import Response

    if scope["type"] != "http":
        return
    request = Request(scope, receive)
    orjson.loads(await request.body())
    await Response(ANSWER, media_type="application/json")(scope, receive, send)


def _serve_uvicorn(app: Any, host: str) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def _serve_aiohttp(host: str) -> None:
    from aiohttp import web

    from load_tests.mock_upstream import new_event_loop

    async def handler(request: web.Request) -> web.Response:
        orjson.loads(await request.read())
        return web.Response(body=ANSWER, content_type="application/json")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, 0, backlog=2048)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"listening on http://{host}:{port}", flush=True)
        await asyncio.Event().wait()  # until SIGTERM

    new_event_loop().run_until_complete(serve())


# ----------------------------------------------------------------------------- the driver
def run_mode(mode: str, seconds: float) -> dict[str, float]:
    proc, url = ListeningProcess.launch(
        ["load_tests.server_compare", "--serve", mode, "--host", "127.0.0.1"], mode, {0}, 20.0
    )
    server = ListeningProcess(proc, url)
    try:
        return asyncio.run(closed_loop_cpu(url, {}, "mock-small", seconds, proc.pid))
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)  # a server process
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)  # always a free one
    args = parser.parse_args(argv)
    if args.serve == "aiohttp":
        _serve_aiohttp(args.host)
        return 0
    if args.serve is not None:
        _serve_uvicorn(_asgi if args.serve == "uvicorn-asgi" else _starlette, args.host)
        return 0
    os.sched_setaffinity(0, {1})
    machine = machine_info()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(max(1, args.runs)):
        for mode in MODES:
            results[mode].append(run_mode(mode, args.seconds))
    med = {
        m: {k: statistics.median(r[k] for r in rs) for k in ("rps", "cpu_us")} for m, rs in results.items()
    }
    lines = [
        f"# HTTP server core per request (medians of {args.runs}; "
        f"load average {machine['loadavg_at_start']})",
        "",
        "| server | req/s | server CPU per request |",
        "| --- | ---: | ---: |",
        *(f"| {m} | {v['rps']:,.0f} | {v['cpu_us']:,.0f} µs |" for m, v in med.items()),
    ]
    save_report(args.out, "server-compare", {"machine": machine, "runs": results, "medians": med}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
