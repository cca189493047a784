"""Plain frozen dataclasses that travel between the gateway's parts.

Conventions:
- Token counts are ``int | None``: None means "unknown", never 0.
- ``Usage.input_tokens`` counts *all* prompt tokens, including cached reads and cache writes
  (OpenAI's ``prompt_tokens`` convention). Providers whose wire format counts them apart
  (Anthropic) normalise into this shape.
- Money is ``Decimal``; prices are USD per 1M tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from gateway.core.record import record


@record
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    estimated: bool = False
    # Of ``cache_write_tokens``, those written with a 1-hour TTL (Anthropic prices them 2x
    # input; the rest are 5-minute writes at 1.25x). None: no 1-hour writes reported.
    cache_write_1h_tokens: int | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object for this usage."""
        prompt = self.input_tokens or 0
        completion = self.output_tokens or 0
        out: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if self.cached_input_tokens is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_input_tokens}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


def usage_from_openai(obj: Any) -> Usage | None:
    """Read an OpenAI-style ``usage`` object (chat, completions or embeddings)."""
    if not isinstance(obj, dict):
        return None
    prompt = obj.get("prompt_tokens")
    completion = obj.get("completion_tokens")
    details = obj.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:  # DeepSeek's spelling of the same count
        cached = obj.get("prompt_cache_hit_tokens")
    cdetails = obj.get("completion_tokens_details")
    reasoning = cdetails.get("reasoning_tokens") if isinstance(cdetails, dict) else None
    if completion is None and prompt is not None and "total_tokens" in obj:
        completion = 0 if obj.get("total_tokens") == prompt else None
    return Usage(
        input_tokens=prompt if isinstance(prompt, int) else None,
        output_tokens=completion if isinstance(completion, int) else None,
        cached_input_tokens=cached if isinstance(cached, int) else None,
        reasoning_tokens=reasoning if isinstance(reasoning, int) else None,
    )


def usage_from_responses(raw: Any) -> Usage | None:
    """A Responses API ``usage`` object -> ``Usage`` (``input_tokens`` includes the cached
    tokens, ``output_tokens`` the reasoning tokens, as OpenAI counts them)."""
    if not isinstance(raw, dict):
        return None
    details = raw.get("input_tokens_details")
    odetails = raw.get("output_tokens_details")
    return Usage(
        input_tokens=_count(raw.get("input_tokens")),
        output_tokens=_count(raw.get("output_tokens")),
        cached_input_tokens=_count(details.get("cached_tokens")) if isinstance(details, dict) else None,
        reasoning_tokens=_count(odetails.get("reasoning_tokens")) if isinstance(odetails, dict) else None,
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_anthropic(raw: Any) -> Usage | None:
    """Anthropic usage -> ``Usage`` (input includes cache reads and cache writes)."""
    if not isinstance(raw, dict):
        return None
    inp = _count(raw.get("input_tokens"))
    read = _count(raw.get("cache_read_input_tokens"))
    write = _count(raw.get("cache_creation_input_tokens"))
    # cache_creation splits the writes by TTL: 5-minute (1.25x input) and 1-hour (2x input).
    split = raw.get("cache_creation")
    w5m = _count(split.get("ephemeral_5m_input_tokens")) if isinstance(split, dict) else None
    w1h = _count(split.get("ephemeral_1h_input_tokens")) if isinstance(split, dict) else None
    if write is None and (w5m is not None or w1h is not None):
        write = (w5m or 0) + (w1h or 0)
    return Usage(
        input_tokens=None if inp is None else inp + (read or 0) + (write or 0),
        output_tokens=_count(raw.get("output_tokens")),
        cached_input_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=w1h,
    )


@dataclass(frozen=True, slots=True)
class Price:
    """USD per 1M tokens. ``cached_input``/``cache_write`` of None mean: priced as input."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None
    cache_write_1h: Decimal | None = None  # 1-hour cache writes; None: priced as cache_write
    batch: Decimal | None = None  # the provider's batch API price as a share of this one (0.5); None: none


@dataclass(frozen=True, slots=True)
class Target:
    """One concrete place a request can be sent: a catalog model on a provider."""

    model: str  # catalog name (what the ledger calls served_model)
    provider: str  # provider name from the policy
    upstream_model: str  # the id the upstream API expects
    price: Price
    context_window: int | None = None
    self_hosted: bool = False  # served by our own engine (savings cause "self_hosted")


@record
class ChatResult:
    """A complete (non-streamed) chat completion in OpenAI shape, with normalised usage."""

    body: dict[str, Any]
    usage: Usage


@record
class RawResult:
    """A complete response of a pass-through endpoint (completions, embeddings)."""

    body: dict[str, Any]
    usage: Usage


class ChatStream(Protocol):
    """An upstream stream that has been accepted (HTTP 200) by the upstream.

    Iterating yields OpenAI ``chat.completion.chunk`` dicts, including a final usage-only
    chunk (``choices == []``) when the upstream reports usage. Iteration ends normally only
    when the upstream ended the stream cleanly; a cut, a malformed event or an idle timeout
    raises ``StreamBrokenError`` / ``UpstreamTimeoutError``. ``usage`` is set as soon as it is
    known. ``aclose`` releases the upstream connection (and cancels the upstream request).
    """

    usage: Usage | None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    async def aclose(self) -> None: ...


@record
class Principal:
    """Who is calling: the tenant and (a non-secret id of) the key used."""

    tenant: str
    key_id: str | None = None  # short hash prefix, never the key itself
    allowed_models: frozenset[str] | None = None  # None: every model/route the policy exposes


@record
class RequestFacts:
    """What one finished request tells the tracer."""

    request_id: str
    started_wall: float  # unix seconds
    endpoint: str
    requested_model: str
    route: str
    target: Target | None
    provider_type: str | None  # "openai" | "anthropic" (gen_ai.provider.name)
    usage: Usage
    cost: Decimal | None
    baseline: Decimal | None
    cache: str
    status: str
    http_status: int
    error_code: str | None
    tenant: str
