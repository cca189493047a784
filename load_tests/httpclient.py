"""A small, fast HTTP/1.1 keep-alive client for load generation (asyncio + httptools).

One ``Connection`` carries one request at a time. It records when the response
headers arrived, when the first body bytes that carry generated content arrived
(for TTFT) and when the response completed. Bodies are not kept unless asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# A non-empty OpenAI ``delta.content``/``text`` or Anthropic ``text_delta``/``partial_json``.
# the first generated text of a stream: chat's content, Anthropic's text/partial_json, a tool's
# arguments, a Responses event's delta (chat's and Anthropic's deltas are objects: no match)
CONTENT_RE = re.compile(rb'"(?:content|text|partial_json|arguments|delta)"\s*:\s*"[^"]')


class ConnectionClosedError(ConnectionError):
    """The server closed the connection before the response completed."""


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: float
    first_byte: float
    first_content: float | None
    done: float
    keep_alive: bool


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: host, port and the request-line path."""

    host: str
    port: int
    path: str

    @classmethod
    def from_url(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs are supported, got {url!r}")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, parts.port or 80, path)


def request_prefix(target: Target, headers: dict[str, str], method: str = "POST") -> bytes:
    """Request line and headers up to (not including) ``content-length`` and the blank line."""
    lines = [f"{method} {target.path} HTTP/1.1", f"host: {target.host}:{target.port}"]
    if not any(k.lower() == "content-type" for k in headers):
        lines.append("content-type: application/json")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def build_request(target: Target, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A complete POST request."""
    return request_prefix(target, headers or {}) + b"content-length: %d\r\n\r\n" % len(body) + body


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, keep_body: bool, content_re: re.Pattern[bytes] | None) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._keep_body = keep_body
        self._content_re = content_re
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._reset(0.0)

    def _reset(self, sent: float) -> None:
        self._sent = sent
        self._first_byte = 0.0
        self._first_content: float | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc or ConnectionClosedError("connection closed by server"))
        self._waiter = None

    def data_received(self, data: bytes) -> None:
        if not self._first_byte:
            self._first_byte = time.perf_counter()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(exc)
            if self.transport is not None:
                self.transport.abort()

    def eof_received(self) -> bool | None:
        return None

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if self._first_content is None and self._content_re is not None:
            # the pattern may straddle two reads: keep a short tail of the previous one
            if self._content_re.search(self._tail + body):
                self._first_content = time.perf_counter()
            else:
                self._tail = body[-32:]
        if self._keep_body:
            self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is None or waiter.done():
            return
        waiter.set_result(
            Response(
                status=self._parser.get_status_code(),
                headers=self._headers,
                body=b"".join(self._body),
                sent=self._sent,
                first_byte=self._first_byte,
                first_content=self._first_content,
                done=time.perf_counter(),
                keep_alive=self._parser.should_keep_alive(),
            )
        )

    def send(self, data: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._reset(time.perf_counter())
        self.transport.write(data)
        return self._waiter


class Connection:
    """One keep-alive connection; ``request`` sends one request and waits for its response."""

    def __init__(self, protocol: _ClientProtocol) -> None:
        self._protocol = protocol

    @classmethod
    async def open(
        cls, target: Target, *, keep_body: bool = False, content_re: re.Pattern[bytes] | None = CONTENT_RE
    ) -> Connection:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: _ClientProtocol(keep_body, content_re), target.host, target.port
        )
        return cls(protocol)

    @property
    def usable(self) -> bool:
        return not self._protocol.closed

    async def request(self, data: bytes, timeout: float) -> Response:
        fut = self._protocol.send(data)
        try:
            resp = await asyncio.wait_for(fut, timeout)
        except BaseException:
            self.close()
            raise
        if not resp.keep_alive:
            self.close()
        return resp

    def close(self) -> None:
        transport = self._protocol.transport
        self._protocol.closed = True
        if transport is not None and not transport.is_closing():
            transport.close()
