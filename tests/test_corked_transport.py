"""The corked transport ``switchyard serve`` hands uvicorn (``gateway.api.corked``): a response
head leaves with the write after it (one write of the real transport), or at the end of the loop
iteration; nothing else waits; closing writes a held head first, aborting drops it. A real
gateway answers through it in every harness test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.api.corked import JOIN_MAX, CorkedTransport


class _Peer(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CorkedTransport, _Peer, list[bytes]]]:
    loop = asyncio.get_running_loop()
    peer = _Peer()
    server = await loop.create_server(lambda: peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    writes: list[bytes] = []
    real_write = transport.write

    def counted(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = counted  # type: ignore[method-assign]
    yield CorkedTransport(transport, loop), peer, writes  # type: ignore[arg-type]
    transport.close()
    server.close()
    await server.wait_closed()


async def _until(peer: _Peer, n: int) -> None:
    for _ in range(200):
        if len(peer.data) >= n:
            return
        await asyncio.sleep(0.005)


async def test_a_head_leaves_with_what_follows_it_and_nothing_else_waits(
    pair: tuple[CorkedTransport, _Peer, list[bytes]],
) -> None:
    corked, peer, writes = pair
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    corked.write(head)
    assert writes == [] and corked.get_write_buffer_size() == len(head)
    corked.write(b"{}")  # the body: both in one write, at once
    assert writes == [head + b"{}"]
    corked.write(b"data: 1\n\n")  # not a head: written at once
    assert writes[-1] == b"data: 1\n\n"
    stream_head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    corked.write(stream_head)  # a stream's head, its first event not here yet
    await asyncio.sleep(0)  # ... leaves at the end of the loop iteration
    assert writes[-1] == stream_head
    corked.write(memoryview(b"7\r\nevent 1\r\n"))
    big = b"x" * (JOIN_MAX + 1)
    corked.write(head)
    corked.write(big)  # not copied after the head: two writes, at once
    assert writes[-2:] == [head, big]
    want = head + b"{}" + b"data: 1\n\n" + stream_head + b"7\r\nevent 1\r\n" + head + big
    await _until(peer, len(want))
    assert bytes(peer.data) == want


async def test_close_writes_what_is_held_and_abort_drops_it(
    pair: tuple[CorkedTransport, _Peer, list[bytes]],
) -> None:
    corked, peer, writes = pair
    corked.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    corked.close()  # no body follows, the connection closes: the head first
    await asyncio.wait_for(peer.closed, 5)
    assert bytes(peer.data) == b"HTTP/1.1 204 No Content\r\n\r\n" and corked.is_closing()
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert len(writes) == 1


async def test_abort_drops_what_is_held(pair: tuple[CorkedTransport, _Peer, list[bytes]]) -> None:
    corked, peer, writes = pair
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.abort()
    await asyncio.wait_for(peer.closed, 5)
    await asyncio.sleep(0)
    assert writes == [] and bytes(peer.data) == b""
