"""A scriptable OpenAI-compatible upstream for hostile-upstream tests and scenarios: each sets
what the next answers look like (a JSON body, or SSE events with an optional delay between
them). It counts the SSE events it managed to write, so a caller can see when the gateway
stopped reading. Also the hostile clients that go with it: raw connections that never finish
their body (``stalled_bodies``), the whole answer on such a socket (``answer_of``) and JSON
nested past any sane depth (``nested``); and ``healthz_while``, the probe that tells whether
some work stalls the gateway's event loop."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import orjson

Json = dict[str, Any]
CHAT = "/v1/chat/completions"
T = TypeVar("T")


def healthz_while(port: int, work: Callable[[], T], probes: list[float] | None = None) -> tuple[float, T]:
    """Run ``work()`` while polling the gateway's /healthz every 5 ms on one keep-alive
    connection: (the slowest /healthz answer in s, what ``work`` returned). Each probe's time
    is appended to ``probes`` when given."""
    done, seen = threading.Event(), probes if probes is not None else []

    def poll() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while not done.is_set():
                t0 = time.perf_counter()
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                seen.append(time.perf_counter() - t0)
                time.sleep(0.005)
        finally:
            conn.close()

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        time.sleep(0.1)
        result = work()
    finally:
        done.set()
        thread.join()
    return max(seen, default=0.0), result


def nested(depth: int) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = [node]
    return node


def stalled_bodies(port: int, key: str, n: int) -> list[socket.socket]:
    """``n`` raw connections that send their headers and the first byte of a 1,000-byte body."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        head = f"POST {CHAT} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n"
        s.sendall((head + "content-type: application/json\r\ncontent-length: 1000\r\n\r\n{").encode())
        socks.append(s)
    return socks


def answer_of(sock: socket.socket) -> bytes:
    """The whole HTTP response on ``sock`` (headers and a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            return data
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")),
        0,
    )
    while len(rest) < length and (part := sock.recv(65536)):
        rest += part
    return head + b"\r\n\r\n" + rest


def chat_body(content: str = "hi", usage: Any = None, **extra: Any) -> Json:
    body: Json = {
        "id": "chatcmpl-lying",
        "object": "chat.completion",
        "created": 1,
        "model": "lying-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        **extra,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def chunk(content: str | None = None, usage: Any = None) -> Json:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    out: Json = {"id": "chatcmpl-lying", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out["choices"] = choices
    if usage is not None:
        out["usage"] = usage
    return out


class LyingUpstream:
    """``json`` answers non-streamed calls; ``events`` (a callable giving an iterator of
    chunk dicts) answers streamed ones, ``delay_s`` apart; ``[DONE]`` follows unless
    ``done`` is False."""

    def __init__(self) -> None:
        self.json: Json = chat_body(usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
        self.events: Callable[[], Iterator[Json]] = lambda: iter([chunk("hi"), chunk(None, {})])
        self.delay_s = 0.0
        self.status = 200  # any other: ``json`` is sent with that status (streams too)
        self.headers_seen: list[dict[str, str]] = []
        self.batch = 1  # events per write (a fast upstream writes many at once)
        self.done = True
        self.written = 0  # SSE events written so far (all requests)
        self.finished = 0  # streams written to their end
        self.requests: list[Json] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                upstream.requests.append(body)
                upstream.headers_seen.append(dict(self.headers))
                if not body.get("stream") or upstream.status != 200:
                    raw = json.dumps(upstream.json).encode()  # stdlib: deeper than orjson writes
                    self.send_response(upstream.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    batch: list[bytes] = []
                    for event in upstream.events():
                        batch.append(b"data: " + json.dumps(event).encode() + b"\n\n")
                        if len(batch) >= upstream.batch:
                            self.wfile.write(b"".join(batch))
                            self.wfile.flush()
                            upstream.written += len(batch)
                            batch.clear()
                        if upstream.delay_s:
                            time.sleep(upstream.delay_s)
                    self.wfile.write(b"".join(batch))
                    upstream.written += len(batch)
                    if upstream.done:
                        self.wfile.write(b"data: [DONE]\n\n")
                        self.wfile.flush()
                    upstream.finished += 1
                except OSError:
                    pass  # the gateway hung up

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LyingUpstream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def lying_policy(url: str, extra: str = "", provider_extra: str = "") -> str:
    return f"""
providers:
  liar:
    type: openai
    base_url: {url}/v1
    api_key: sk-liar-secret-0123456789abcdef
{provider_extra}models:
  lm: {{provider: liar, upstream: lying-model, price: {{input: 1.0, output: 2.0}}}}
routes:
  lie:
    targets: [lm]
    retries: 0
    max_output_tokens: 64
    stream_idle_timeout_s: 5
tenants:
  capped:
    budget: {{daily_usd: 1}}
{extra}
"""
