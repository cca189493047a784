"""uvicorn's HTTP protocol with a response's head and body in one send.

uvicorn writes a response's head and its body with two ``transport.write`` calls: two
``send()`` syscalls and two TCP segments per response (~2 µs of CPU each here). The transport
``CorkedHttpToolsProtocol`` hands uvicorn holds a response head (a write that starts with the
status line) until the next write, which takes it along in one write; a head with no write
after it in the same loop iteration (a stream waiting for its first event, a HEAD or 204
answer) leaves at the end of that iteration (``call_soon``). Nothing else waits: a stream's
events and a body go out at once, in order; closing writes a held head first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

JOIN_MAX = 64 * 1024  # a body up to this size is copied after the head; a bigger one is not


class CorkedTransport(asyncio.Transport):
    """``transport`` with a response head held for the write that follows it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= JOIN_MAX:
                self._transport.write(held[0] + bytes(data))
                return
            self._transport.write(held[0])  # a big body: two sends rather than a copy of it
            self._transport.write(data)
        elif data[:7] == b"HTTP/1.":  # a response head: its body most likely follows at once
            self._held = [bytes(data)]
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0])

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(b) for b in self._held or ())

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a ``CorkedTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))
