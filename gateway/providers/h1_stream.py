"""An accepted streamed answer of the HTTP/1.1 client (``providers/h1.py``): the body as it
arrives, with flow control (the connection stops reading past ``HIGH_WATER`` buffered bytes
until the reader catches up), line reading with a bound, an idle limit, and release: a stream
read to its end goes back to its pool; one left early, broken or closed drops its connection.

The idle limit (``readany``/``readline``'s ``idle``: how long a read may wait with nothing
arriving) is one lazy timer per stream, re-armed only when it fires early, not an
``asyncio.timeout`` per read (~4 µs of CPU each: two reads per streamed token)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.providers.h1_wire import H1Error

HIGH_WATER = 256 * 1024  # buffered body bytes that pause the connection's reading
RELEASE_WAIT_S = 1.0  # how long a released stream waits for its answer's last bytes


class Carrier(Protocol):
    """What a stream needs from its connection."""

    def abort(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class H1Stream:
    """``status`` and ``headers`` as received; ``readany``/``readline``/``read_body`` for the
    body; ``release`` when done reading (reuses the connection if the answer ended cleanly),
    ``close`` to drop it."""

    def __init__(
        self, conn: Carrier, status: int, headers: Mapping[str, str], give_back: Callable[[], None]
    ) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._give_back = give_back
        self._buf: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._eof = False
        self._keep = False
        self._error: H1Error | None = None
        self._wait: asyncio.Future[None] | None = None
        self._done = False  # released or closed
        self._settled = False  # the connection went back to the pool or was dropped
        self._release_timer: asyncio.TimerHandle | None = None
        self._line = b""  # readline's unread bytes
        self._pos = 0
        self._fed_at = 0.0  # time.monotonic() of the last bytes (or the start of the wait)
        self._watchdog: asyncio.TimerHandle | None = None  # the idle limit's timer, while armed

    # ----------------------------------------------------------- fed by the connection
    def feed(self, data: bytes) -> None:
        if self._done:
            return  # released early: the rest of the answer is discarded
        self._buf.append(data)
        self._buffered += len(data)
        self._fed_at = time.monotonic()
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause()
        self._wake()

    def end(self, keep_alive: bool) -> None:
        self._eof, self._keep = True, keep_alive
        if self._done:
            self._settle()
        self._wake()

    def lost(self, clean_end: bool, what: str) -> None:
        """The connection closed: the end of an answer read until close, or a break."""
        if not self._eof:
            if clean_end:
                self._eof = True
            else:
                self._error = H1Error("disconnected", f"the upstream closed the stream ({what})")
        self._keep = False
        if self._done:
            self._settle()
        self._wake()

    def _wake(self) -> None:
        wait = self._wait
        if wait is not None and not wait.done():
            wait.set_result(None)

    # ----------------------------------------------------------------------- reading
    async def readany(self, idle: float | None = None) -> bytes:
        """What has arrived (waiting for something); b"" at the end of the answer. With
        ``idle``, a wait with no bytes arriving for that many seconds raises H1Error("stalled")."""
        while True:
            buf = self._buf
            if buf:
                data = buf.popleft() if len(buf) == 1 else b"".join(buf)
                buf.clear()
                self._buffered = 0
                if self._paused:
                    self._paused = False
                    self._conn.resume()
                return data
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            loop = asyncio.get_running_loop()
            self._wait = loop.create_future()
            if idle is not None:
                self._fed_at = time.monotonic()  # the wait starts the clock (bytes reset it)
                if self._watchdog is None:
                    self._watchdog = loop.call_later(idle, self._check_idle, loop, idle)
            try:
                await self._wait
            finally:
                self._wait = None

    def _check_idle(self, loop: asyncio.AbstractEventLoop, idle: float) -> None:
        """The idle timer fired: fail the waiting read if nothing arrived for ``idle`` seconds,
        else wait out the rest (nobody waiting: disarmed until the next wait)."""
        self._watchdog = None
        wait = self._wait
        if wait is None or wait.done() or self._done:
            return
        left = idle - (time.monotonic() - self._fed_at)
        if left > 0:
            self._watchdog = loop.call_later(left, self._check_idle, loop, idle)
            return
        wait.set_exception(H1Error("stalled", f"nothing arrived for {idle:g}s"))

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def readline(self, limit: int, idle: float | None = None) -> bytes:
        """One line with its b"\\n" (the rest without one at the end; b"" once all is read).
        A line longer than ``limit`` raises H1Error("oversized"); ``idle`` as for ``readany``."""
        while True:
            end = self._line.find(b"\n", self._pos)
            if end - self._pos >= limit or (end < 0 and len(self._line) - self._pos > limit):
                raise H1Error("oversized", f"a line longer than {limit} bytes")
            if end >= 0:
                line = self._line[self._pos : end + 1]
                self._pos = end + 1
                return line
            piece = await self.readany(idle)
            rest = self._line[self._pos :]
            self._pos = 0
            if not piece:
                self._line = b""
                return rest
            self._line = rest + piece if rest else piece

    async def read_body(self, limit: int) -> bytes | None:
        """The rest of the body, or None once it grows past ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while piece := await self.readany():
            size += len(piece)
            if size > limit:
                return None
            parts.append(piece)
        return b"".join(parts)

    # ------------------------------------------------------------------------ ending
    def release(self) -> None:
        """Done reading. An answer read to its end returns its connection to the pool; one
        whose last bytes (a chunked answer's terminator after ``[DONE]``) are still on the
        way waits for them up to RELEASE_WAIT_S; anything else drops the connection."""
        if self._done:
            return
        self._done = True
        self._disarm()
        self._buf.clear()
        self._buffered = 0
        if self._eof or self._error is not None:
            self._settle()
            return
        if self._paused:  # let the rest arrive (discarded) so the end can be seen
            self._paused = False
            self._conn.resume()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # released outside a loop (a finalizer): nothing can wait
            self.close()
            return
        self._release_timer = loop.call_later(RELEASE_WAIT_S, self.close)

    def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        if self._eof and self._keep and self._error is None:
            self._give_back()
        else:
            self._conn.abort()

    def close(self) -> None:
        """Drop the connection (nothing more is read)."""
        self._done = True
        self._keep = False
        self._disarm()
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        self._buf.clear()
        if not self._settled:
            self._settled = True
            self._conn.abort()
