"""The unary upstream client (gateway/providers/h1.py) against a raw asyncio TCP server that
writes exactly the bytes each case needs: framing, encodings, bounds, keep-alive and its
races, cancellation, and the requests it sends."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
import subprocess
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.core.errors import UpstreamError
from gateway.providers import h1, h1_stream, http
from gateway.providers.h1 import H1Error, H1Pool
from gateway.providers.h1_stream import H1Stream

Reply = Callable[[bytes], list[bytes] | None]  # the request head+body -> bytes to write; None: close


@dataclass
class Server:
    reply: Reply
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    close_after_reply: bool = False
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                out = self.reply(request)
                if out is None:
                    break
                for piece in out:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if self.close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def started(reply: Reply) -> tuple[Server, asyncio.Server]:
    server = Server(reply)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = srv.sockets[0].getsockname()[1]
    return server, srv


def ok(body: bytes, *extra: str, status: str = "200 OK") -> list[bytes]:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return [(head + "".join(f"{h}\r\n" for h in extra) + "\r\n").encode() + body]


HEADERS = {"content-type": "application/json", "authorization": "Bearer k"}


async def test_request_bytes_and_keep_alive() -> None:
    server, srv = await started(lambda req: ok(b'{"a":1}'))
    pool = H1Pool(f"http://127.0.0.1:{server.port}/v1")
    try:
        for _ in range(3):
            resp = await pool.post("/chat/completions", b'{"x":1}', HEADERS, 1000)
            assert (resp.status, resp.body, resp.headers["content-type"]) == (
                200,
                b'{"a":1}',
                "application/json",
            )
        assert server.connections == 1  # one kept-alive connection served all three
        head, _, body = server.requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
        assert f"Host: 127.0.0.1:{server.port}".encode() in lines
        assert b"Content-Length: 7" in lines and b"authorization: Bearer k" in lines
        assert body == b'{"x":1}'
    finally:
        await pool.aclose()
        srv.close()


async def test_chunked_and_split_reads() -> None:
    payload = b'{"text":"' + b"y" * 5000 + b'"}'
    chunks = [payload[:10], payload[10:4000], payload[4000:]]
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    wire = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n" + body
    # the answer arrives in 7-byte pieces: headers and chunk sizes split anywhere
    server, srv = await started(lambda req: [wire[i : i + 7] for i in range(0, len(wire), 7)])
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        resp = await pool.post("/x", b"{}", HEADERS, 10_000)
        assert resp.body == payload
        assert (await pool.post("/x", b"{}", HEADERS, 10_000)).body == payload
        assert server.connections == 1
    finally:
        await pool.aclose()
        srv.close()


async def test_gzip_deflate_and_their_bounds() -> None:
    payload = b'{"v":"' + b"z" * 3000 + b'"}'
    answers = {
        b"/gzip": ok(gzip.compress(payload), "content-encoding: gzip"),
        b"/deflate": ok(zlib.compress(payload), "content-encoding: deflate"),
        b"/raw-deflate": ok(zlib.compress(payload)[2:-4], "content-encoding: deflate"),
        b"/br": ok(b"xx", "content-encoding: br"),
        b"/corrupt": ok(b"not gzip at all", "content-encoding: gzip"),
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        for path in ("/gzip", "/deflate", "/raw-deflate"):
            assert (await pool.post(path, b"", HEADERS, 10_000)).body == payload, path
        # a bomb: 3 KB inflated past a 1 KB bound is "too large", not memory
        assert (await pool.post("/gzip", b"", HEADERS, 1000)).body is None
        for path in ("/br", "/corrupt"):
            with pytest.raises(H1Error) as info:
                await pool.post(path, b"", HEADERS, 10_000)
            assert info.value.kind == "protocol"
        assert b"Accept-Encoding: gzip, deflate" in server.requests[0]
    finally:
        await pool.aclose()
        srv.close()


async def test_body_bound_drops_the_connection() -> None:
    big = b"q" * 5000
    no_length = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    answers = {b"/declared": ok(big), b"/chunked": [no_length + b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big)]}
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        for path in ("/declared", "/chunked"):
            resp = await pool.post(path, b"", HEADERS, 4000)
            assert resp.status == 200 and resp.body is None
        assert server.connections == 2  # never reused after an over-bound answer
        assert pool._idle == []
    finally:
        await pool.aclose()
        srv.close()


async def test_read_until_close_and_connection_close() -> None:
    answers = {
        b"/eof": [b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"e":', b"1}"],
        b"/close": ok(b"{}", "connection: close"),
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    server.close_after_reply = True
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        assert (await pool.post("/eof", b"", HEADERS, 100)).body == b'{"e":1}'
        assert (await pool.post("/close", b"", HEADERS, 100)).body == b"{}"
        assert pool._idle == [] and server.connections == 2
    finally:
        await pool.aclose()
        srv.close()


async def test_interim_answer_is_skipped_and_errors_keep_status_and_headers() -> None:
    cont = [b"HTTP/1.1 100 Continue\r\n\r\n", *ok(b'{"ok":true}')]
    answers = {
        b"/continue": cont,
        b"/429": ok(b'{"error":{"message":"slow down"}}', "retry-after: 7", status="429 Too Many Requests"),
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        assert (await pool.post("/continue", b"", HEADERS, 100)).body == b'{"ok":true}'
        resp = await pool.post("/429", b"", HEADERS, 100)
        assert resp.status == 429 and resp.headers["retry-after"] == "7"
        assert http.parse_retry_after(resp.headers) == 7.0
    finally:
        await pool.aclose()
        srv.close()


async def test_close_mid_answer_is_disconnected_and_malformed_is_protocol() -> None:
    answers = {
        b"/half": [b'HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{"partial"'],
        b"/garbage": [b"SMTP ready\r\n\r\n"],
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    server.close_after_reply = True
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        with pytest.raises(H1Error) as info:
            await pool.post("/half", b"", HEADERS, 100)
        assert info.value.kind == "disconnected"
        err = http.transport_error("up", info.value)
        assert isinstance(err, UpstreamError) and err.code == "upstream_disconnected" and err.retryable
        with pytest.raises(H1Error) as info:
            await pool.post("/garbage", b"", HEADERS, 100)
        assert info.value.kind == "protocol"
        assert http.transport_error("up", info.value).code == "upstream_bad_response"
    finally:
        await pool.aclose()
        srv.close()


async def test_connect_refused_maps_to_connect_error() -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    pool = H1Pool(f"http://127.0.0.1:{port}")
    with pytest.raises(H1Error) as info:
        await pool.post("/x", b"", HEADERS, 100)
    assert http.transport_error("up", info.value).code == "upstream_connect_error"


async def test_keep_alive_race_is_retried_only_after_idling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled connection the server closes without answering (its idle timeout fired as the
    request left) is retried once on a new connection, but only if it had idled >= RACE_IDLE_S:
    a busy connection whose server died may have had its request read."""
    calls = {"n": 0}

    def reply(req: bytes) -> list[bytes] | None:
        calls["n"] += 1
        return None if calls["n"] == 2 else ok(b"{}")  # the second request: closed unanswered

    server, srv = await started(reply)
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        monkeypatch.setattr(h1, "RACE_IDLE_S", 0.0)
        await pool.post("/x", b"", HEADERS, 100)
        assert (await pool.post("/x", b"", HEADERS, 100)).body == b"{}"  # retried: requests 2 and 3
        assert (calls["n"], server.connections) == (3, 2)
        monkeypatch.setattr(h1, "RACE_IDLE_S", 60.0)
        calls["n"] = 1
        with pytest.raises(H1Error) as info:
            await pool.post("/x", b"", HEADERS, 100)
        assert info.value.kind == "disconnected" and calls["n"] == 2  # not retried
    finally:
        await pool.aclose()
        srv.close()


async def test_cancelled_call_drops_its_connection() -> None:
    def reply(req: bytes) -> list[bytes] | None:
        return [] if b"/slow" in req.split(b"\r\n")[0] else ok(b"{}")

    server, srv = await started(reply)
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.post("/slow", b"", HEADERS, 100)
        assert pool._idle == []  # a half-answered connection is never reused
        await pool.post("/x", b"", HEADERS, 100)
        assert server.connections == 2
    finally:
        await pool.aclose()
        srv.close()


async def test_deadlines_fail_late_calls_only_and_the_sweep_stops() -> None:
    """``post(timeout=...)``: a call past its deadline raises TimeoutError about on time and
    drops its connection; calls with later deadlines, on the same sweep, are untouched; the
    sweep timer is gone once nothing waits."""

    def reply(req: bytes) -> list[bytes] | None:
        return [] if b"/slow" in req.split(b"\r\n")[0] else ok(b"{}")

    server, srv = await started(reply)
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    loop = asyncio.get_running_loop()
    try:

        async def timed(path: str, timeout: float) -> tuple[str, float]:
            t0 = loop.time()
            try:
                await pool.post(path, b"", HEADERS, 100, timeout)
                return "ok", loop.time() - t0
            except TimeoutError:
                return "timeout", loop.time() - t0

        slow_short, slow_long, fast = await asyncio.gather(
            timed("/slow", 0.02), timed("/slow", 0.3), timed("/x", 5.0)
        )
        assert slow_short[0] == "timeout" and 0.015 <= slow_short[1] < 0.2, slow_short  # nearer than SWEEP_S
        assert slow_long[0] == "timeout" and 0.29 <= slow_long[1] < 0.3 + h1.SWEEP_S + 0.2, slow_long
        assert fast[0] == "ok"
        assert pool._waiting == set() and pool._sweep is None
        assert len(pool._idle) == 1  # the two timed-out connections were dropped, not pooled
        assert (await pool.post("/x", b"", HEADERS, 100, 5.0)).status == 200
        assert server.connections == 3
    finally:
        await pool.aclose()
        srv.close()


async def test_idle_connections_expire_and_server_closes_are_seen() -> None:
    server, srv = await started(lambda req: ok(b"{}"))
    pool = H1Pool(f"http://127.0.0.1:{server.port}", keepalive_s=0.05)
    try:
        await pool.post("/x", b"", HEADERS, 100)
        await asyncio.sleep(0.1)
        await pool.post("/x", b"", HEADERS, 100)  # the idle one was past keepalive_s: a new one
        assert server.connections == 2
        for writer in server.writers:  # the server closes its side of every idle connection
            writer.close()
        await asyncio.sleep(0.05)
        assert all(conn.closed for conn in pool._idle)
    finally:
        await pool.aclose()
        srv.close()


@pytest.mark.parametrize("value", ["a\r\nx-injected: 1", "a\nb", "nul\0"])
async def test_header_with_line_break_is_refused_before_sending(value: str) -> None:
    server, srv = await started(lambda req: ok(b"{}"))
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        with pytest.raises(H1Error) as info:
            await pool.post("/x", b"", {"anthropic-beta": value}, 100)
        assert info.value.kind == "request" and server.requests == []
        err = http.transport_error("up", info.value)
        assert not err.retryable and "x-injected" not in err.message
    finally:
        await pool.aclose()
        srv.close()


def test_url_forms() -> None:
    assert H1Pool("https://api.openai.com/v1")._authority == "api.openai.com"
    assert H1Pool("http://[::1]:8080")._authority == "[::1]:8080"
    assert H1Pool("http://host:80/")._prefix == ""
    with pytest.raises(ValueError):
        H1Pool("ftp://x")


def test_under_uvloop() -> None:
    """The server runs on uvloop, whose transports are not asyncio.Transport subclasses."""
    import uvloop

    async def main() -> tuple[int, bytes | None, int]:
        server, srv = await started(lambda req: ok(b'{"u":1}'))
        pool = H1Pool(f"http://127.0.0.1:{server.port}")
        try:
            for _ in range(2):
                resp = await pool.post("/x", b"{}", HEADERS, 100)
            return resp.status, resp.body, server.connections
        finally:
            await pool.aclose()
            srv.close()

    assert uvloop.run(main()) == (200, b'{"u":1}', 1)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed (apt-get install -y openssl)")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tls_upstream(tmp_path: Path, loop: str) -> None:
    """Real providers are HTTPS: the handshake, SNI and certificate check on both loops; an
    untrusted certificate is a connect error, never a silent downgrade."""
    import uvloop

    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def main() -> tuple[bytes | None, str]:
        server = Server(lambda req: ok(b'{"tls":true}'))
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=server_ctx)
        port = srv.sockets[0].getsockname()[1]
        good = H1Pool(f"https://localhost:{port}/v1", ssl_context=trusting)
        bad = H1Pool(f"https://localhost:{port}/v1")  # the system trust store: not this cert
        try:
            body = (await good.post("/x", b"{}", HEADERS, 100)).body
            body2 = (await good.post("/x", b"{}", HEADERS, 100)).body
            assert body == body2 and server.connections == 1
            try:
                await bad.post("/x", b"{}", HEADERS, 100)
                kind = "none"
            except H1Error as exc:
                kind = exc.kind
            return body, kind
        finally:
            await good.aclose()
            await bad.aclose()
            srv.close()

    run = uvloop.run if loop == "uvloop" else asyncio.run
    assert run(main()) == (b'{"tls":true}', "connect")


def chunked(*pieces: bytes, head: str = "content-type: text/event-stream") -> list[bytes]:
    out = [f"HTTP/1.1 200 OK\r\n{head}\r\ntransfer-encoding: chunked\r\n\r\n".encode()]
    out += [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
    out.append(b"0\r\n\r\n")
    return out


async def test_stream_lines_split_anywhere_and_reuse_after_the_end() -> None:
    events = [b'data: {"n":%d}\n\n' % i for i in range(50)] + [b"data: [DONE]\n\n"]
    wire = b"".join(events)
    pieces = [wire[i : i + 13] for i in range(0, len(wire), 13)]  # lines cut mid-way
    server, srv = await started(lambda req: chunked(*pieces))
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        for _ in range(2):
            stream = await pool.open("/s", b"{}", HEADERS)
            assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
            lines = []
            while line := await stream.readline(1000):
                lines.append(line)
            assert b"".join(lines) == wire and all(x.endswith(b"\n") for x in lines)
            stream.release()
        assert server.connections == 1 and len(pool._idle) == 1  # the stream's connection served twice
        assert b"Accept-Encoding: identity" in server.requests[0]
    finally:
        await pool.aclose()
        srv.close()


async def test_stream_released_before_its_terminator_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """After [DONE] the chunked terminator may still be on its way: release() hands the
    connection back once it lands; a stream released with more to come is dropped after
    RELEASE_WAIT_S (never reused half-read)."""
    monkeypatch.setattr(h1_stream, "RELEASE_WAIT_S", 0.1)
    gate = asyncio.Event()

    class Slow(Server):
        async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.writers.append(writer)
            try:
                await reader.readuntil(b"\r\n\r\n")
                first, *rest = chunked(b"data: [DONE]\n\n")
                writer.write(first + rest[0])
                await gate.wait()
                writer.write(b"".join(rest[1:]))
                await writer.drain()
                await reader.read()  # until the client hangs up
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

    server = Slow(lambda req: None)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    pool = H1Pool(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}")
    try:
        stream = await pool.open("/s", b"{}", HEADERS)
        assert await stream.readline(100) == b"data: [DONE]\n"
        stream.release()
        assert pool._idle == []
        gate.set()
        for _ in range(50):
            if pool._idle:
                break
            await asyncio.sleep(0.01)
        assert len(pool._idle) == 1  # the terminator landed: reusable
        gate.clear()
        pool._idle.clear()
        stream = await pool.open("/s", b"{}", HEADERS)
        stream.release()  # nothing read, terminator held back: dropped after the wait
        await asyncio.sleep(0.2)
        assert pool._idle == []
    finally:
        gate.set()
        await pool.aclose()
        srv.close()
        await asyncio.sleep(0.05)  # the handlers see the hang-ups and close their side


async def test_stream_flow_control_pauses_and_keeps_every_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h1_stream, "HIGH_WATER", 4096)
    pieces = [bytes([65 + i % 26]) * 1000 + b"\n" for i in range(400)]
    server, srv = await started(lambda req: chunked(*pieces))
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    paused: list[bool] = []
    try:
        stream = await pool.open("/s", b"{}", HEADERS)
        await asyncio.sleep(0.2)  # the server writes 400 KB while nobody reads
        paused.append(stream._paused)
        got = []
        while piece := await stream.readany():
            got.append(piece)
            await asyncio.sleep(0)
        assert b"".join(got) == b"".join(pieces)
        assert paused == [True]
        stream.release()
    finally:
        await pool.aclose()
        srv.close()


async def test_stream_breaks_bounds_and_refusals() -> None:
    answers = {
        b"/cut": [chunked(b"data: 1\n\n")[0] + b"40\r\ndata: partial"],
        b"/long": chunked(b"data: " + b"x" * 5000 + b"\n"),
        b"/err": ok(b'{"error":{"message":"bad key"}}', status="401 Unauthorized"),
        b"/gz": [b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 3\r\n\r\nabc"],
        b"/eof": [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: a\n\n", b"data: b\n\n"],
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    server.close_after_reply = True
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        stream = await pool.open("/cut", b"", HEADERS)
        with pytest.raises(H1Error) as info:
            while await stream.readany():
                pass
        assert info.value.kind == "disconnected"
        stream.close()
        stream = await pool.open("/long", b"", HEADERS)
        with pytest.raises(H1Error) as info:
            await stream.readline(1000)
        assert info.value.kind == "oversized"
        stream.close()
        stream = await pool.open("/err", b"", HEADERS)
        assert stream.status == 401 and await stream.read_body(1000) == b'{"error":{"message":"bad key"}}'
        stream.release()
        await pool.aclose()  # that connection is being closed by the server: do not race it
        with pytest.raises(H1Error) as info:
            await pool.open("/gz", b"", HEADERS)
        assert info.value.kind == "protocol"
        stream = await pool.open("/eof", b"", HEADERS)  # no length, not chunked: ends at close
        assert await stream.read_body(1000) == b"data: a\n\ndata: b\n\n"
        stream.release()
        assert pool._idle == []
    finally:
        await pool.aclose()
        srv.close()


class _Conn:
    def abort(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


async def test_a_stream_read_fails_after_its_idle_limit_of_silence_only() -> None:
    """The idle limit counts silence while a read waits: bytes every 0.1 s keep a 0.3 s limit
    from firing over a whole second; a reader that was busy gets a fresh limit when it waits;
    silence past the limit fails the read with kind "stalled"; one lazy timer, not one per read."""
    loop = asyncio.get_running_loop()
    stream = H1Stream(_Conn(), 200, {}, lambda: None)
    for i in range(10):
        loop.call_later(0.1 * (i + 1), stream.feed, b"data: %d\n\n" % i)
    started = time.monotonic()
    lines = [await stream.readline(1024, idle=0.3) for _ in range(20)]
    assert time.monotonic() - started >= 0.9 and lines[-2] == b"data: 9\n"
    await asyncio.sleep(0.5)  # the reader is busy elsewhere, longer than the limit
    loop.call_later(0.2, stream.feed, b"late\n")
    assert await stream.readline(1024, idle=0.3) == b"late\n"  # the wait started the clock
    started = time.monotonic()
    with pytest.raises(H1Error) as info:
        await stream.readline(1024, idle=0.3)
    assert info.value.kind == "stalled" and 0.25 <= time.monotonic() - started < 2.0
    stream.close()


async def test_an_answer_head_past_the_bound_is_a_bad_answer() -> None:
    """A 200 KB response header (or a head that never ends) fails the call as a bad answer
    (502 upstream_bad_response) instead of being buffered; a large but sane head passes."""
    big = "x-big: " + "a" * 200_000
    answers = {
        b"/big": ok(b'{"a":1}', big),
        b"/endless": [b"HTTP/1.1 200 OK\r\nx-slow: " + b"b" * (h1.MAX_HEADER_BYTES + 10)],
        b"/fine": ok(b'{"a":1}', "x-fine: " + "c" * 32_000),
    }
    server, srv = await started(lambda req: answers[req.split(b" ")[1]])
    pool = H1Pool(f"http://127.0.0.1:{server.port}")
    try:
        for path in ("/big", "/endless"):
            with pytest.raises(H1Error) as info:
                await pool.post(path, b"", HEADERS, 1000, timeout=5)
            assert info.value.kind == "protocol" and "64 KiB" in str(info.value)
            err = http.transport_error("up", info.value)
            assert err.code == "upstream_bad_response" and err.status == 502
        got = await pool.post("/fine", b"", HEADERS, 1000, timeout=5)
        assert got.status == 200 and len(got.headers["x-fine"]) == 32_000
    finally:
        await pool.aclose()
        srv.close()
