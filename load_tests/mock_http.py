"""Minimal, fast HTTP/1.1 server protocol for the mock (asyncio + httptools).

Keep-alive and pipelining are supported; requests on one connection are answered in
order. Replies with no delay and no fault are written synchronously from the parser
callback (no task per request), which is what makes the mock cheap at high rates.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from typing import Any, cast

import httptools

from load_tests.mock_reply import Reply
from load_tests.mock_router import MockApp, Plan, Request

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}
_MALFORMED = {
    "openai": b"data: {not json\n\n",
    "anthropic": b"event: content_block_delta\ndata: {not json\n\n",
}
_LAST_CHUNK = b"0\r\n\r\n"
_FLUSH_WAIT_S = 2.0


def head(reply: Reply, keep_alive: bool, length: int | None) -> bytes:
    """Status line and headers; ``length`` None means chunked transfer encoding."""
    lines = [
        f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}",
        f"content-type: {reply.content_type}",
        "transfer-encoding: chunked" if length is None else f"content-length: {length}",
    ]
    if length is None:
        lines.append("cache-control: no-cache")
    if not keep_alive:
        lines.append("connection: close")
    lines.extend(f"{k}: {v}" for k, v in reply.headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def render(reply: Reply, keep_alive: bool) -> bytes:
    """The whole response in one buffer (no delays, no faults)."""
    if reply.events is None:
        return head(reply, keep_alive, len(reply.body)) + reply.body
    return head(reply, keep_alive, None) + b"".join(chunk(e) for e in reply.events) + _LAST_CHUNK


class MockProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, app: MockApp, connections: set[MockProtocol]) -> None:
        self._app = app
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._pending: deque[tuple[Request, bool]] = deque()
        self._task: asyncio.Task[None] | None = None

    # asyncio.Protocol -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._write_and_close(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
        except httptools.HttpParserError:
            self._write_and_close(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # httptools callbacks ----------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = val if old is None else old + ", " + val

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = self._url.decode("latin-1")
        path, _, query = url.partition("?")
        method = self._parser.get_method().decode("latin-1")
        req = Request(method, path, query, self._headers, b"".join(self._body))
        keep_alive = self._parser.should_keep_alive()
        if self._task is not None and not self._task.done():
            self._pending.append((req, keep_alive))
            return
        plan = self._app.plan(req)
        if plan.immediate:
            self._send_now(plan.reply, keep_alive)
        else:
            self._task = asyncio.get_running_loop().create_task(self._serve(plan, keep_alive))

    # sending ----------------------------------------------------------------
    def _send_now(self, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(render(reply, keep_alive))
        if not keep_alive:
            transport.close()

    def _write_and_close(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)
            self._transport.close()

    async def _serve(self, plan: Plan, keep_alive: bool) -> None:
        await self._act(plan, keep_alive)
        while self._pending:
            req, keep_alive = self._pending.popleft()
            plan = self._app.plan(req)
            if plan.immediate:
                self._send_now(plan.reply, keep_alive)
            else:
                await self._act(plan, keep_alive)

    async def _act(self, plan: Plan, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        fault = plan.fault or {}
        kind = fault.get("kind")
        if kind == "reset":
            self._reset()
            return
        if kind == "stall":
            await asyncio.sleep(float(fault.get("seconds", 1.0)))
        reply = plan.reply
        if reply.events is None:
            await self._send_body(plan, fault, keep_alive)
        else:
            await self._send_stream(plan, fault, keep_alive)
        if not keep_alive:
            self.close()

    async def _send_body(self, plan: Plan, fault: dict[str, Any], keep_alive: bool) -> None:
        reply = plan.reply
        delay = plan.ttft_s + plan.itl_s * reply.n_paced
        if delay > 0:
            await asyncio.sleep(delay)
        kind = fault.get("kind")
        transport = self._transport
        assert transport is not None
        if kind in ("cut_mid_stream", "stall_mid_stream"):
            half = len(reply.body) // 2
            transport.write(head(reply, keep_alive, len(reply.body)) + reply.body[:half])
            if kind == "cut_mid_stream":
                await self._flush_then_close()
                return
            await asyncio.sleep(float(fault.get("seconds", 1.0)))
            transport.write(reply.body[half:])
            return
        transport.write(render(reply, keep_alive))

    async def _send_stream(self, plan: Plan, fault: dict[str, Any], keep_alive: bool) -> None:
        reply = plan.reply
        events = reply.events or ()
        transport = self._transport
        assert transport is not None
        kind = fault.get("kind")
        at = int(fault.get("after_chunks", 0)) if kind else -1
        transport.write(head(reply, keep_alive, None))
        buf: list[bytes] = []
        if plan.ttft_s > 0:
            await asyncio.sleep(plan.ttft_s)
        for i in range(len(events) + 1):
            if i == at:
                if buf:
                    transport.write(b"".join(buf))
                    buf.clear()
                if kind == "cut_mid_stream":
                    await self._flush_then_close()
                    return
                if kind == "stall_mid_stream":
                    await asyncio.sleep(float(fault.get("seconds", 1.0)))
                elif kind == "malformed_sse":
                    transport.write(chunk(_MALFORMED.get(reply.dialect, _MALFORMED["openai"])))
                    if fault.get("close"):
                        await self._flush_then_close()
                        return
            if i == len(events):
                break
            if plan.itl_s > 0 and reply.paced[i]:
                if buf:
                    transport.write(b"".join(buf))
                    buf.clear()
                await asyncio.sleep(plan.itl_s)
                if transport.is_closing():
                    return
            buf.append(chunk(events[i]))
        buf.append(_LAST_CHUNK)
        transport.write(b"".join(buf))

    async def _flush_then_close(self) -> None:
        """Close after the buffered bytes went out, without a terminating chunk."""
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FLUSH_WAIT_S
        while transport.get_write_buffer_size() > 0 and loop.time() < deadline:
            await asyncio.sleep(0.001)
        self._pending.clear()
        transport.close()

    def _reset(self) -> None:
        """Abort with RST (SO_LINGER 0), sending nothing."""
        transport = self._transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._pending.clear()
        transport.abort()
