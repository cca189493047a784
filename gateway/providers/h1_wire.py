"""The bytes side of the HTTP/1.1 client (``providers/h1.py``): its error, the complete
answer, request heads (checked for CR/LF) and content-encoding removal (bounded)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from gateway.core.errors import UpstreamError
from gateway.core.record import record

MAX_HEADER_BYTES = 64 * 1024  # an answer's head (status line and headers) larger than this is refused


class H1Error(UpstreamError):
    """No complete HTTP answer. ``kind``: ``connect`` (no connection), ``disconnected`` (the
    server closed or reset it before the answer was whole), ``protocol`` (not HTTP/1.1 the
    parser accepts, or an encoding we cannot decode), ``oversized`` (one stream line past the
    reader's bound), ``stalled`` (a stream read waited past its idle limit), ``request`` (a
    header we refuse to send). ``providers.http.transport_error``
    turns it into the error the client sees, with the provider's name."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}", code=f"upstream_{kind}")
        self.kind = kind


@record
class H1Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased; repeated fields joined with ", "
    body: bytes | None  # None: the answer was larger than the caller's limit


_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def identity(encoding: str | None) -> bool:
    return not encoding or encoding.strip().lower() == "identity"


def decoded(body: bytes, encoding: str | None, limit: int) -> bytes | None:
    """``body`` with its content-encoding removed; None past ``limit`` decoded bytes."""
    if identity(encoding):
        return body
    assert encoding is not None
    wbits = _DECODERS.get(encoding.strip().lower())
    if wbits is None:
        raise H1Error("protocol", f"content-encoding {encoding!r} is not supported")
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(body, limit + 1)
        if len(out) > limit or decoder.unconsumed_tail:
            return None  # more than limit bytes once inflated
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


def request_head(
    target: str, authority: str, headers: Mapping[str, str], length: int, *, compressed: bool
) -> bytes:
    """A POST head. ``compressed``: accept gzip/deflate (complete answers); streams ask for
    identity (their events are read as they arrive)."""
    lines = [f"POST {target} HTTP/1.1", f"Host: {authority}"]
    for name, value in headers.items():
        for text in (name, value):
            if "\r" in text or "\n" in text or "\0" in text:
                shown = name.splitlines()[0][:40] if name else ""
                raise H1Error("request", f"header {shown!r} holds a line break")
        lines.append(f"{name}: {value}")
    lines.append("Accept-Encoding: gzip, deflate" if compressed else "Accept-Encoding: identity")
    lines.append(f"Content-Length: {length}")
    lines.append("\r\n")
    try:
        return "\r\n".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise H1Error("request", "a header is not latin-1 text") from None
