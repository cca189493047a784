"""A small HTTP/1.1 client for the unary upstream calls (one JSON request, one bounded answer).

aiohttp's client costs ~70 µs of CPU per call on one core here, most of the pass-through
floor and a quarter of the gateway's whole miss path; this one, an ``asyncio.Protocol`` over
``httptools`` (the parser uvicorn uses), ~20 µs (``python -m load_tests.client_compare``).
Streams keep aiohttp (their flow control and line reading are its strength, and a stream's
per-call cost is spread over its events).

What it does: keep-alive connections per upstream (LIFO, closed when idle past
``keepalive_s`` or marked ``Connection: close``), TLS with the system trust store, request
heads checked for CR/LF, ``Content-Length`` and chunked answers and answers read until the
server closes, gzip/deflate answers (decompressed size bounded too), 1xx answers skipped,
answer bodies bounded (the connection is dropped, not drained, past the bound). A connection
taken from the pool that the server closed before sending any byte of the answer (the
keep-alive race: the server's idle timeout fired as the request left) is retried once on a
new connection when it had sat idle for a second or more (a server that dies while a busy
connection waits is not retried: it may have read the request). Anything else that goes
wrong drops the connection and raises :class:`H1Error`; cancellation (the caller's timeout,
a client that left) drops it too, so a half-read answer is never reused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.core.errors import UpstreamError


class H1Error(UpstreamError):
    """No complete HTTP answer. ``kind``: ``connect`` (no connection), ``disconnected`` (the
    server closed or reset it before the answer was whole), ``protocol`` (not HTTP/1.1 the
    parser accepts, or an encoding we cannot decode), ``request`` (a header we refuse to send).
    ``providers.http.transport_error`` turns it into the error the client sees, with the
    provider's name."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}", code=f"upstream_{kind}")
        self.kind = kind


@dataclass(frozen=True, slots=True)
class H1Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased; repeated fields joined with ", "
    body: bytes | None  # None: the answer was larger than the caller's limit


_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class _Conn(asyncio.Protocol):
    """One connection; at most one request in flight (no pipelining)."""

    __slots__ = (
        "_got_bytes",
        "_headers",
        "_limit",
        "_parser",
        "_parts",
        "_size",
        "_status",
        "_too_big",
        "_until_close",
        "_waiter",
        "closed",
        "idle_since",
        "transport",
    )

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[H1Response] | None = None
        self._reset(0)

    def _reset(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._headers: dict[str, str] = {}
        self._status = 0
        self._got_bytes = False
        self._until_close = False
        self._too_big = False

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes on an idle connection: it is not safe to reuse
            self.abort()
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(H1Error("protocol", "the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(H1Error("protocol", f"malformed HTTP answer ({type(exc).__name__})"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._until_close and exc is None and self._status:
            self._finish()
            return
        what = type(exc).__name__ if exc is not None else "closed"
        kind = "disconnected" if self._got_bytes else "closed_idle"
        self._fail(H1Error(kind, f"the upstream closed the connection ({what})"))

    # ------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        headers = self._headers
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._limit:
            self._too_big = True
            self._finish()
            return
        if length is None and "chunked" not in headers.get("transfer-encoding", "").lower():
            self._until_close = self._status >= 200 and self._status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        if self._too_big:
            return
        self._size += len(body)
        if self._size > self._limit:
            self._too_big = True
            self._finish()
            return
        self._parts.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer: the real one follows
            limit = self._limit
            self._reset(limit)
            self._got_bytes = True
            return
        self._finish()

    # ------------------------------------------------------------------------ helpers
    def _finish(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._too_big:
            self.abort()  # not drained: the rest of a huge answer is not worth reading
            waiter.set_result(H1Response(self._status, self._headers, None))
            self._headers = {}
            return
        try:
            body = _decoded(b"".join(self._parts), self._headers.get("content-encoding"), self._limit)
        except H1Error as exc:
            self._fail(exc)
            return
        if self._until_close or not self._parser.should_keep_alive():
            self.abort()
        waiter.set_result(H1Response(self._status, self._headers, body))
        self._headers = {}  # bytes a broken server sends after its answer cannot touch it

    def _fail(self, exc: H1Error) -> None:
        self.abort()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def send(self, head: bytes, body: bytes, limit: int) -> asyncio.Future[H1Response]:
        assert self.transport is not None
        self._reset(limit)
        waiter: asyncio.Future[H1Response] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(head)
        if body:
            self.transport.write(body)
        return waiter

    def done(self) -> None:
        self._waiter = None


def _decoded(body: bytes, encoding: str | None, limit: int) -> bytes | None:
    """The body with its content-encoding removed; None past ``limit`` decoded bytes."""
    if not encoding or encoding.strip().lower() == "identity":
        return body
    wbits = _DECODERS.get(encoding.strip().lower())
    if wbits is None:
        raise H1Error("protocol", f"content-encoding {encoding!r} is not supported")
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(body, limit + 1)
        if len(out) > limit:
            return None
        if decoder.unconsumed_tail:
            return None  # more than limit + 1 bytes once inflated
        return out + decoder.flush()
    except zlib.error:
        if wbits == zlib.MAX_WBITS:  # "deflate" sent raw, without the zlib header
            return _raw_deflate(body, limit)
        raise H1Error("protocol", "the compressed body is corrupt") from None


def _raw_deflate(body: bytes, limit: int) -> bytes | None:
    decoder = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error:
        raise H1Error("protocol", "the compressed body is corrupt") from None
    return None if len(out) > limit or decoder.unconsumed_tail else out


def _check_header(name: str, value: str) -> None:
    for text in (name, value):
        if "\r" in text or "\n" in text or "\0" in text:
            raise H1Error("request", f"header {name.splitlines()[0][:40]!r} holds a line break")


RACE_IDLE_S = 1.0  # a reused connection closed unanswered is retried only after this much idling


class H1Pool:
    """Keep-alive connections to one upstream origin (``base_url``'s scheme, host and port;
    its path is prefixed to every request path)."""

    def __init__(
        self,
        base_url: str,
        *,
        keepalive_s: float = 30.0,
        max_idle: int = 512,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._authority = host if default_port else f"{host}:{self._port}"
        self._prefix = parts.path.rstrip("/")
        self._keepalive = keepalive_s
        self._max_idle = max_idle
        self._idle: list[_Conn] = []
        self._ssl = ssl_context  # None: the system trust store, made at the first connection

    def _head(self, path: str, headers: Mapping[str, str], length: int) -> bytes:
        lines = [f"POST {self._prefix}{path} HTTP/1.1", f"Host: {self._authority}"]
        for name, value in headers.items():
            _check_header(name, value)
            lines.append(f"{name}: {value}")
        lines.append("Accept-Encoding: gzip, deflate")
        lines.append(f"Content-Length: {length}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    def _take(self) -> tuple[_Conn | None, float]:
        """A live idle connection (the most recently used) and how long it sat idle."""
        idle = self._idle
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn, now - conn.idle_since
            conn.abort()
        return None, 0.0

    def _give_back(self, conn: _Conn) -> None:
        conn.done()
        if conn.closed or conn.transport is None or conn.transport.is_closing():
            return
        if len(self._idle) >= self._max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, conn = await loop.create_connection(
                _Conn,
                self._host,
                self._port,
                ssl=self._ssl if self._tls else None,
                server_hostname=self._host if self._tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise H1Error("connect", f"cannot connect ({type(exc).__name__})") from None
        return conn

    async def post(self, path: str, body: bytes, headers: Mapping[str, str], limit: int) -> H1Response:
        """POST ``body``; the answer with its body (None past ``limit`` bytes)."""
        try:
            head = self._head(path, headers, len(body))
        except UnicodeEncodeError:
            raise H1Error("request", "a header is not latin-1 text") from None
        conn, idle_for = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, limit)
            except H1Error as exc:
                if exc.kind != "closed_idle" or idle_for < RACE_IDLE_S:
                    exc.kind = "disconnected" if exc.kind == "closed_idle" else exc.kind
                    raise
            # the keep-alive race: the server closed this idle connection as we wrote to it
        conn = await self._connect()
        try:
            return await self._exchange(conn, head, body, limit)
        except H1Error as exc:
            if exc.kind == "closed_idle":
                exc.kind = "disconnected"
            raise

    async def _exchange(self, conn: _Conn, head: bytes, body: bytes, limit: int) -> H1Response:
        try:
            response = await conn.send(head, body, limit)
        except BaseException:
            conn.abort()
            conn.done()
            raise
        self._give_back(conn)
        return response

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()


class LazyPool:
    """A provider's pool, made at first use (mirrors ``http.LazySession``)."""

    __slots__ = ("_base", "_pool")

    def __init__(self, base_url: str) -> None:
        self._base = base_url
        self._pool: H1Pool | None = None

    def get(self) -> H1Pool:
        if self._pool is None:
            self._pool = H1Pool(self._base)
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None
