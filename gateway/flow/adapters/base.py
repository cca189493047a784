"""What an inbound protocol gives the one pipeline (gateway/flow/pipeline.py).

An adapter is made per request from its validated wire body. It translates the body once
into the ``RequestRecord`` the steps read, says which targets it can pass its wire body to
unchanged (``native``), calls a target, renders an answer, a cached answer or a stream in
its protocol. Everything else (plan, limits, caches, classifier, reservation, attempts,
deadlines, metering, stickiness) is the pipeline's, written once for every protocol.

A new inbound protocol: its wire models in ``gateway/protocols/``, an adapter here, and one
line registering its handler in ``gateway/api/``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import orjson

from gateway.cache.replay import StreamAssembler, completion_to_chunks
from gateway.config.policy import ParamsPolicy
from gateway.core.errors import SwitchyardError
from gateway.core.ports import Provider
from gateway.core.request import RequestRecord
from gateway.core.types import ChatStream, Target, Usage
from gateway.flow.exchange import Exchange
from gateway.flow.reply import DONE, Reply, headers, sse
from gateway.flow.services import Services
from gateway.routing.params import apply_params
from gateway.routing.plan import RoutePlan

CHAT_FINISHES = ("stop", "tool_calls", "length")
EMPTY: Mapping[str, str] = {}
NONE: list[str] = []  # never mutated


@dataclass(slots=True)
class Answer:
    """A complete upstream answer: from a same-protocol upstream, ``body`` as it came; from a
    chat upstream, the chat ``completion`` (rendered in the client's protocol once metered)."""

    usage: Usage
    body: dict[str, Any] | None = None
    completion: dict[str, Any] | None = None


class Upstream(Protocol):
    """An accepted upstream stream of any protocol (ChatStream, MessagesStream, ResponsesStream)."""

    usage: Usage | None

    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def aclose(self) -> None: ...


class Encoder(Protocol):
    """An upstream stream's items as the client's frames (gateway/flow/stream.py relays)."""

    def first(self, item: Any) -> bytes:
        """The frames of the first item (with any opening frames of the protocol)."""
        ...

    def add(self, item: Any) -> bytes:
        """The frames of a later item (b"" when it shows the client nothing)."""
        ...

    def last(self, item: Any) -> bool:
        """True when ``item`` is the terminal one: the row is committed before it goes out."""
        ...

    def completion(self) -> dict[str, Any] | None:
        """The answer so far as a chat completion (None: not a chat upstream)."""
        ...

    async def finish(self, ex: Exchange) -> bytes:
        """The stream ended well (``ex.usage`` metered): the closing frames, sent after the
        row is committed. May store what the protocol keeps, or mark ``ex`` failed."""
        ...

    def cached(self, usage: Usage) -> bytes | None:
        """What the exact and semantic caches store for this answer, metered with ``usage``
        (None: not cacheable)."""
        ...

    def error(self, exc: SwitchyardError) -> bytes:
        """The frame of an error that ends the stream."""
        ...


class Inbound:
    """The defaults every adapter shares; the chat-completion family (chat, completions,
    Responses over chat) caches chat completions, so a hit serves any of them."""

    endpoint = "chat"  # the ledger's name for the endpoint
    answers = "chat"  # the shape of cached answers: entries of one shape only meet their own
    names: ClassVar[Mapping[str, str | None] | None] = None  # route param names on the wire (None: chat's)

    def __init__(self, svc: Services, wire: dict[str, Any], headers: Mapping[str, str] = EMPTY) -> None:
        self.svc = svc
        self.wire = wire  # the client's body: what a same-protocol pass-through sends
        self.headers_in = headers  # the request headers the API read (api/state.py WANTED)
        self.params: ParamsPolicy | None = None  # the route's, once applied
        self.record: RequestRecord  # made by ``prepare``, inside the pipeline's bookkeeping

    @property
    def model(self) -> str:
        return str(self.wire.get("model") or "")

    @property
    def stream(self) -> bool:
        return bool(self.wire.get("stream"))

    @property
    def task_header(self) -> str | None:
        return self.headers_in.get("x-switchyard-task") or None

    # the request -------------------------------------------------------------
    def record_of(
        self,
        body: dict[str, Any],
        *,
        dropped: list[str] = NONE,
        hint: Any = None,
        include_usage: bool = False,
    ) -> RequestRecord:
        """The record of this request, whose chat form is ``body``; ``hint``: an explicit
        conversation key the wire body carries (used when a non-empty string)."""
        return RequestRecord(
            self.endpoint, self.model, body, self.stream, include_usage,
            hint if isinstance(hint, str) and hint else None, self.task_header, tuple(dropped),
        )  # fmt: skip

    def translate(self) -> RequestRecord:
        """The wire body as the record (may raise BadRequestError)."""
        raise NotImplementedError

    async def prepare(self, ex: Exchange) -> None:
        """Translate the wire body into the record (a bad request raises BadRequestError);
        an adapter whose translation needs I/O (stored conversation state) does it here."""
        self.record = self.translate()

    def retranslate(self) -> None:
        """The record again from a rewritten wire body (the compression step)."""
        self.record = self.translate()

    def apply(self, params: ParamsPolicy) -> None:
        """The route's params, on the record's body and on the wire body."""
        self.params = params
        body = apply_params(self.record.body, params)
        if body is not self.record.body:
            self.record = replace(self.record, body=body)
            if self.names is not None:  # a protocol of its own: its wire body too, for pass-through
                self.wire = apply_params(self.wire, params, self.names)

    def native(self, target: Target | None) -> bool:
        """The target's provider takes this protocol's wire body unchanged."""
        return False

    def cacheable(self, plan: RoutePlan) -> bool:
        """Whether answers of this request may be cached on this route at all."""
        return True

    def keyed(self) -> dict[str, Any]:
        """What the exact-cache key hashes (with the tenant, route and ``answers``)."""
        return self.record.body

    def headers(self, ex: Exchange) -> dict[str, str]:
        out = headers(ex)
        if self.record.dropped and not self.native(ex.target):
            out["x-switchyard-dropped"] = ",".join(self.record.dropped)
        return out

    # the answer ---------------------------------------------------------------
    async def call(self, provider: Provider, target: Target, timeout: float) -> Answer:
        result = await provider.chat(self.record.body, target, timeout)
        return Answer(result.usage, completion=result.body)

    async def open(self, provider: Provider, target: Target, timeout: float, idle: float) -> Upstream:
        stream: ChatStream = await provider.chat_stream(self.record.body, target, timeout, idle)
        return stream

    def from_completion(self, completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
        """A chat completion as this protocol's answer."""
        raise NotImplementedError

    def body_of(self, answer: Answer, usage: Usage) -> dict[str, Any]:
        """The answer in the client's protocol, metered with ``usage``."""
        if answer.body is not None:
            return answer.body
        assert answer.completion is not None
        return self.from_completion(answer.completion, usage)

    async def render(self, answer: Answer, ex: Exchange) -> bytes:
        """The answer's body for the client (before the row is committed)."""
        return orjson.dumps(self.body_of(answer, ex.usage))

    def cached(self, answer: Answer, usage: Usage) -> bytes | None:
        """What the caches store for this answer (None: not cacheable)."""
        completion = answer.completion
        return orjson.dumps(completion) if completion is not None and finished(completion) else None

    def cached_usage(self, cached: dict[str, Any]) -> Usage | None:
        from gateway.core.types import usage_from_openai

        return usage_from_openai(cached.get("usage"))

    async def replay(self, cached: dict[str, Any], raw: bytes, ex: Exchange) -> Reply:
        """A cached answer (``raw``: its JSON) in this protocol, JSON or frames (the chat
        family: a cached chat completion through ``from_completion`` or the chunk frames)."""
        if not self.record.stream:
            return Reply(self.headers(ex), body=orjson.dumps(self.from_completion(cached, ex.usage)))
        encoder = self.encoder(None, ex)
        assert isinstance(encoder, ChatChunks)
        return Reply(self.headers(ex), stream=frames_of(encoder.replayed(cached)))

    def encoder(self, stream: Upstream | None, ex: Exchange) -> Encoder:
        raise NotImplementedError


def finished(completion: dict[str, Any]) -> bool:
    """A chat completion every choice of which ended for a reason worth caching."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(c.get("finish_reason") in CHAT_FINISHES for c in choices)


class ChatEncoder:
    """The chat-completion family's encoder over a chat upstream: chunks assembled (metering,
    cache), each sent as ``frame(chunk)`` (this protocol's frames of one chunk)."""

    def __init__(self) -> None:
        self.assembler = StreamAssembler()

    def completion(self) -> dict[str, Any] | None:
        return self.assembler.completion()

    def last(self, item: Any) -> bool:
        return False

    def cached(self, usage: Usage) -> bytes | None:
        completion = self.assembler.completion()
        return orjson.dumps(completion) if finished(completion) else None


class ChatChunks(ChatEncoder):
    """Chat chunks as SSE ``data:`` frames, ``[DONE]`` last: chat as it came (the usage-only
    chunk only when the client asked for it); ``frame`` is the protocol's shape of a chunk."""

    def __init__(self, include_usage: bool) -> None:
        super().__init__()
        self.include_usage = include_usage

    def frame(self, chunk: dict[str, Any]) -> bytes:
        return sse(chunk)

    def first(self, item: dict[str, Any]) -> bytes:
        return self.add(item)

    def add(self, item: dict[str, Any]) -> bytes:
        self.assembler.add(item)
        if not self.include_usage and not item.get("choices") and item.get("usage"):
            return b""  # the usage-only chunk the client did not ask for
        return self.frame(item)

    async def finish(self, ex: Exchange) -> bytes:
        return DONE

    def error(self, exc: SwitchyardError) -> bytes:
        return sse(exc.to_body())

    def replayed(self, completion: dict[str, Any]) -> list[bytes]:
        """A cached completion as the frames a streaming client would have got."""
        frames = [self.frame(c) for c in completion_to_chunks(completion, self.include_usage)]
        return [f for f in frames if f] + [DONE]


async def frames_of(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item
