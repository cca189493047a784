"""Server-sent events from an accepted upstream response (Anthropic Messages, OpenAI
Responses): ``event:``/``data:`` framing, the idle timeout between reads, the size bound of
one event, release/close. Subclasses turn the (event name, data bytes) pairs into what
their port promises."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from gateway.core.errors import StreamBrokenError
from gateway.core.types import Usage
from gateway.providers.h1 import H1Error, H1Stream

MAX_EVENT_BYTES = 8 * 1024 * 1024  # one SSE event larger than this is a broken stream


class EventStream:
    """An accepted SSE response: framing, idle timeout, release/close."""

    def __init__(self, provider: str, resp: H1Stream, idle_timeout: float) -> None:
        self._provider = provider
        self._resp = resp
        self._idle = idle_timeout
        self.usage: Usage | None = None
        self._gen: AsyncGenerator[Any, None] | None = None  # the subclass's iteration, once started

    async def aclose(self) -> None:
        gen = self._gen
        if gen is not None:
            # RuntimeError: another task is iterating right now; closing the response suffices.
            with contextlib.suppress(RuntimeError):
                await gen.aclose()
        self._resp.close()

    def _broken(self, what: str) -> StreamBrokenError:
        return StreamBrokenError(f"upstream '{self._provider}' stream {what}")

    async def _read(self) -> bytes:
        try:
            return await self._resp.readany(self._idle)
        except H1Error as exc:
            if exc.kind == "stalled":
                raise self._broken(f"stalled for more than {self._idle:g}s") from None
            raise self._broken(f"broke ({exc.kind})") from None

    async def _events(self) -> AsyncGenerator[tuple[str, bytes], None]:
        """SSE framing: ``event:``/``data:`` fields, a blank line ends an event; lines end in
        LF or CRLF; comments and other fields are skipped; an event may span several reads."""
        buffer = b""
        event, data = "", bytearray()
        has_data = False
        while True:
            piece = await self._read()
            if not piece:
                return
            buffer += piece
            if b"\n" not in piece:
                if len(buffer) > MAX_EVENT_BYTES:
                    raise self._broken("sent an oversized event")
                continue
            *lines, buffer = buffer.split(b"\n")
            if len(data) > MAX_EVENT_BYTES:
                raise self._broken("sent an oversized event")
            for raw_line in lines:
                line = raw_line[:-1] if raw_line.endswith(b"\r") else raw_line
                if not line:
                    if has_data:
                        yield event, bytes(data)
                    event, data, has_data = "", bytearray(), False
                    continue
                field, _, value = line.partition(b":")
                value = value[1:] if value.startswith(b" ") else value
                if field == b"event":
                    event = value.decode("utf-8", "replace")
                elif field == b"data":
                    if has_data:
                        data += b"\n"
                    data += value
                    has_data = True

    def _parse(self, data: bytes) -> dict[str, Any]:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise self._broken("sent a malformed event")
        return parsed


class TypedEventStream(EventStream):
    """Typed JSON events relayed as they are: iterating yields (event name, data bytes, parsed
    data) up to and including the event ``_note`` says is the last; an ``error`` event, a
    malformed event or an end before the last event raises StreamBrokenError."""

    LAST = "the last event"  # named in the error of a stream that ends early

    def __aiter__(self) -> AsyncIterator[tuple[str, bytes, dict[str, Any]]]:
        if self._gen is None:
            self._gen = self._iterate()
        return self._gen

    def _note(self, kind: str, data: dict[str, Any]) -> bool:
        """Read what the event tells (usage...); True when it ends the stream."""
        raise NotImplementedError

    def _error(self, data: dict[str, Any]) -> str | None:
        """What an ``error`` event names (its type or code), for the error message."""
        raise NotImplementedError

    async def _iterate(self) -> AsyncGenerator[tuple[str, bytes, dict[str, Any]], None]:
        finished = False
        try:
            async with contextlib.aclosing(self._events()) as events:
                async for event, raw in events:
                    data = self._parse(raw)
                    kind = str(data["type"]) if isinstance(data.get("type"), str) else event
                    if kind == "error":
                        raise self._broken(f"sent an error event ({self._error(data) or 'unknown'})")
                    finished = self._note(kind, data)
                    yield event or kind, raw, data
                    if finished:
                        return
            raise self._broken(f"ended before {self.LAST}")
        finally:
            if finished:
                self._resp.release()
            else:
                self._resp.close()
