"""A small HTTP/1.1 client for the unary upstream calls (one JSON request, one bounded answer).

aiohttp's client costs ~70 µs of CPU per call on one core here, most of the pass-through
floor and a quarter of the gateway's whole miss path; this one, an ``asyncio.Protocol`` over
``httptools`` (the parser uvicorn uses), ~20 µs (``python -m load_tests.client_compare``).
Streams (``open``) use it too: the answer's head is awaited, then the body is read as it
arrives (``h1_stream.H1Stream``: flow control, bounded lines, release back to the pool).

What it does: keep-alive connections per upstream (LIFO, closed when idle past
``keepalive_s`` or marked ``Connection: close``), TLS with the system trust store, request
heads checked for CR/LF, ``Content-Length`` and chunked answers and answers read until the
server closes, gzip/deflate answers (decompressed size bounded too), 1xx answers skipped,
answer heads bounded (``MAX_HEADER_BYTES``: past it the call fails as a bad answer, a 502),
answer bodies bounded (the connection is dropped, not drained, past the bound). A connection
taken from the pool that the server closed before sending any byte of the answer (the
keep-alive race: the server's idle timeout fired as the request left) is retried once on a
new connection when it had sat idle for a second or more (a server that dies while a busy
connection waits is not retried: it may have read the request). Anything else that goes
wrong drops the connection and raises :class:`H1Error`; cancellation (the caller's timeout,
a client that left) drops it too, so a half-read answer is never reused. ``post``'s timeout is
a deadline the pool's one sweep timer checks (``SWEEP_S``, sooner for a nearer deadline), not
an ``asyncio.timeout`` per call (~5 µs of CPU each here); past it the call raises TimeoutError.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.core.batch import UPSTREAM_IDEMPOTENCY_KEY
from gateway.providers.h1_stream import H1Stream
from gateway.providers.h1_wire import MAX_HEADER_BYTES, H1Error, H1Response, decoded, identity, request_head

__all__ = ["MAX_HEADER_BYTES", "RACE_IDLE_S", "H1Error", "H1Pool", "H1Response", "H1Stream", "LazyPool"]

RACE_IDLE_S = 1.0  # a reused connection closed unanswered is retried only after this much idling
SWEEP_S = 0.05  # how often the pool looks for answers past their deadline while calls wait


class _Conn(asyncio.Protocol):
    """One connection; at most one request in flight (no pipelining). A complete answer
    resolves the waiter with an H1Response; in stream mode the head resolves it with an
    H1Stream that the body is then fed to."""

    __slots__ = (
        "_got_bytes",
        "_head_bytes",
        "_headers",
        "_limit",
        "_parser",
        "_parts",
        "_pool",
        "_size",
        "_status",
        "_stream",
        "_streaming",
        "_too_big",
        "_until_close",
        "_waiter",
        "closed",
        "deadline",
        "idle_since",
        "transport",
    )

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.deadline = 0.0  # time.monotonic() past which the awaited answer has timed out
        self._waiter: asyncio.Future[H1Response | H1Stream] | None = None
        self._stream: H1Stream | None = None
        self._streaming = False
        self._reset(0)

    def _reset(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._headers: dict[str, str] = {}
        self._head_bytes = 0  # bytes read while the head is unfinished (-1: it is whole)
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
            return
        if self._head_bytes >= 0:  # the head is still arriving: bounded (the parser buffers it)
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                kib = MAX_HEADER_BYTES // 1024
                self._fail(H1Error("protocol", f"response headers larger than {kib} KiB"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        what = type(exc).__name__ if exc is not None else "closed"
        stream = self._stream
        if stream is not None:
            stream.lost(self._until_close and exc is None, what)
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._until_close and exc is None and self._status:
            self._finish()
            return
        kind = "disconnected" if self._got_bytes else "closed_idle"
        self._fail(H1Error(kind, f"the upstream closed the connection ({what})"))

    # ------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._head_bytes = -1
        self._status = status = self._parser.get_status_code()
        headers = self._headers
        length = headers.get("content-length")
        if length is None and "chunked" not in headers.get("transfer-encoding", "").lower():
            self._until_close = status >= 200 and status not in (204, 304)
        if status < 200:
            return  # an interim answer: the real one follows
        if self._streaming:
            waiter = self._waiter
            if waiter is None or waiter.done():
                return
            if not identity(headers.get("content-encoding")):
                self._fail(H1Error("protocol", "the upstream compressed a stream it was asked not to"))
                return
            self._stream = H1Stream(self, status, headers, self._stream_done)
            waiter.set_result(self._stream)
            return
        if length is not None and length.isdigit() and int(length) > self._limit:
            self._too_big = True
            self._finish()

    def on_body(self, body: bytes) -> None:
        if self._stream is not None:
            self._stream.feed(body)
            return
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
            self._reset(self._limit)
            self._got_bytes = True
            return
        if self._stream is not None:
            self._stream.end(self._parser.should_keep_alive() and not self._until_close)
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
            body = decoded(b"".join(self._parts), self._headers.get("content-encoding"), self._limit)
        except H1Error as exc:
            self._fail(exc)
            return
        if self._until_close or not self._parser.should_keep_alive():
            self.abort()
        waiter.set_result(H1Response(self._status, self._headers, body))
        self._headers = {}  # bytes a broken server sends after its answer cannot touch it

    def _fail(self, exc: H1Error) -> None:
        if self._stream is not None:
            self._stream.lost(False, exc.kind)
        self.abort()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def expire(self) -> None:
        """The deadline passed with the answer not complete: fail the call, drop the connection."""
        waiter = self._waiter
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError())

    def _stream_done(self) -> None:
        """The stream was read to its end and released: the connection may serve again."""
        self._pool.give_back(self)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def send(
        self, head: bytes, body: bytes, limit: int, stream: bool
    ) -> asyncio.Future[H1Response | H1Stream]:
        assert self.transport is not None
        self._reset(limit)
        self._streaming = stream
        self._stream = None
        waiter: asyncio.Future[H1Response | H1Stream] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.transport.write(head + body if body else head)  # one send, not two (~3 µs each)
        return waiter

    def done(self) -> None:
        self._waiter = None
        self._stream = None
        self._streaming = False


def _keyed(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` plus the Idempotency-Key of the call being made, when it has one (a batch
    item's: gateway/core/batch.py)."""
    key = UPSTREAM_IDEMPOTENCY_KEY.get()
    return headers if key is None else {**headers, "idempotency-key": key}


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
        self._waiting: set[_Conn] = set()  # unary calls with a deadline, answer not complete yet
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0

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

    def give_back(self, conn: _Conn) -> None:
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
                lambda: _Conn(self),
                self._host,
                self._port,
                ssl=self._ssl if self._tls else None,
                server_hostname=self._host if self._tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise H1Error("connect", f"cannot connect ({type(exc).__name__})") from None
        return conn

    async def post(
        self, path: str, body: bytes, headers: Mapping[str, str], limit: int, timeout: float | None = None
    ) -> H1Response:
        """POST ``body``; the whole answer with its body (None past ``limit`` bytes). Past
        ``timeout`` seconds (connecting included) the connection is dropped: TimeoutError."""
        head = request_head(self._prefix + path, self._authority, _keyed(headers), len(body), compressed=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        got = await self._request(head, body, limit, stream=False, deadline=deadline)
        assert isinstance(got, H1Response)
        return got

    async def open(self, path: str, body: bytes, headers: Mapping[str, str]) -> H1Stream:
        """POST ``body``; the answer once its head has arrived, its body still to read. The
        caller must ``release()`` or ``close()`` it."""
        head = request_head(
            self._prefix + path, self._authority, _keyed(headers), len(body), compressed=False
        )
        got = await self._request(head, body, 0, stream=True)
        assert isinstance(got, H1Stream)
        return got

    async def _request(
        self, head: bytes, body: bytes, limit: int, stream: bool, deadline: float | None = None
    ) -> H1Response | H1Stream:
        conn, idle_for = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, limit, stream, deadline)
            except H1Error as exc:
                if exc.kind != "closed_idle" or idle_for < RACE_IDLE_S:
                    exc.kind = "disconnected" if exc.kind == "closed_idle" else exc.kind
                    raise
            # the keep-alive race: the server closed this idle connection as we wrote to it
        if deadline is None:
            conn = await self._connect()
        else:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                conn = await self._connect()
        try:
            return await self._exchange(conn, head, body, limit, stream, deadline)
        except H1Error as exc:
            if exc.kind == "closed_idle":
                exc.kind = "disconnected"
            raise

    async def _exchange(
        self, conn: _Conn, head: bytes, body: bytes, limit: int, stream: bool, deadline: float | None
    ) -> H1Response | H1Stream:
        try:
            waiter = conn.send(head, body, limit, stream)
            if deadline is not None:
                self._watch(conn, deadline)
            got = await waiter
        except BaseException:
            conn.abort()
            conn.done()
            raise
        finally:
            if deadline is not None:
                self._waiting.discard(conn)
        if not stream:
            self.give_back(conn)
        return got

    def _watch(self, conn: _Conn, deadline: float) -> None:
        """Fail ``conn``'s call at ``deadline``: one sweep timer for all waiting calls."""
        conn.deadline = deadline
        self._waiting.add(conn)
        at = min(deadline, time.monotonic() + SWEEP_S)
        if self._sweep is None or at < self._sweep_at:
            if self._sweep is not None:
                self._sweep.cancel()
            self._arm(at)

    def _arm(self, at: float) -> None:
        self._sweep_at = at
        self._sweep = asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._sweeping)

    def _sweeping(self) -> None:
        self._sweep = None
        now = time.monotonic()
        late = [conn for conn in self._waiting if conn.deadline <= now]
        for conn in late:
            self._waiting.discard(conn)
            conn.expire()
        if self._waiting:
            self._arm(min(now + SWEEP_S, min(conn.deadline for conn in self._waiting)))

    async def aclose(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()


class LazyPool:
    """A provider's pool, made at first use inside the running loop."""

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
