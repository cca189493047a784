"""HTTP plumbing shared by the provider modules: the single place where transport failures
and HTTP statuses become Switchyard errors (the client itself is ``providers/h1.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import time
from collections.abc import Mapping

import orjson

from gateway.core.errors import (
    SwitchyardError,
    UpstreamError,
    UpstreamRateLimitedError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
)
from gateway.core.redact import redact
from gateway.core.types import Usage
from gateway.providers.h1 import H1Error


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from Retry-After (delta-seconds or HTTP date) or retry-after-ms."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def upstream_message(raw: bytes, limit: int = 300) -> str:
    """The upstream's own error message, if it sent a JSON error, shortened and scrubbed of
    anything shaped like a credential (upstreams echo partial keys in auth errors)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    msg = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else None)
    if not isinstance(msg, str):
        return ""
    return redact(msg[:limit])


def status_error(provider: str, status: int, headers: Mapping[str, str], raw: bytes) -> SwitchyardError:
    """Map a non-2xx upstream answer to the error tree (see gateway/core/ports.py, Provider)."""
    detail = upstream_message(raw)
    suffix = f": {detail}" if detail else ""
    if status == 429:
        return UpstreamRateLimitedError(
            f"upstream '{provider}' is rate limiting{suffix}",
            upstream_status=429,
            retry_after=parse_retry_after(headers),
        )
    if status >= 500:
        err = UpstreamError(
            f"upstream '{provider}' failed with HTTP {status}{suffix}", upstream_status=status
        )
        if status in (503, 529):
            err.status = 503
        return err
    if status in (401, 403):
        return UpstreamError(
            f"upstream '{provider}' refused the gateway's credentials (HTTP {status}); check its API key",
            upstream_status=status,
            retryable=False,
            code="upstream_auth_failed",
        )
    if status == 404:
        return UpstreamError(
            f"upstream '{provider}' does not know this model or path (HTTP 404){suffix}",
            upstream_status=status,
            retryable=False,
            code="upstream_not_found",
        )
    return UpstreamRejectedError(
        f"upstream '{provider}' rejected the request{suffix}", upstream_status=status
    )


def transport_error(provider: str, exc: BaseException) -> SwitchyardError:
    """Map a failure without an HTTP answer (the client's, a timeout, a socket error) to the
    error tree."""
    if isinstance(exc, H1Error):
        return _h1_error(provider, exc)
    if isinstance(exc, SwitchyardError):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return UpstreamTimeoutError(f"upstream '{provider}' timed out")
    if isinstance(exc, ConnectionError):
        return UpstreamError(f"upstream '{provider}' closed the connection", code="upstream_disconnected")
    return UpstreamError(f"upstream '{provider}' transport failure ({type(exc).__name__})")


def _h1_error(provider: str, exc: H1Error) -> SwitchyardError:
    if exc.kind == "connect":
        return UpstreamError(f"cannot connect to upstream '{provider}'", code="upstream_connect_error")
    if exc.kind == "protocol":
        return bad_response(provider, str(exc).partition(": ")[2])
    if exc.kind == "request":
        return UpstreamError(
            f"the request headers for upstream '{provider}' are invalid ({str(exc).partition(': ')[2]})",
            retryable=False,
            code="upstream_bad_request_headers",
        )
    return UpstreamError(f"upstream '{provider}' closed the connection", code="upstream_disconnected")


MAX_RESPONSE_BYTES = 32 * 1024 * 1024  # a complete JSON answer larger than this is not an answer
MAX_ERROR_BYTES = 64 * 1024


def bad_response(provider: str, what: str) -> UpstreamError:
    return UpstreamError(
        f"upstream '{provider}' sent a malformed response: {what}", code="upstream_bad_response"
    )


MAX_TOKEN_COUNT = 10**9  # more tokens than any one answer can hold: the upstream is lying


def checked_usage(usage: Usage | None) -> Usage | None:
    """Usage as the upstream reported it, with every count that cannot be true (a bool, below
    0, over ``MAX_TOKEN_COUNT``) dropped to unknown; the result is then marked ``estimated``
    so the flow fills the gap with the tokenizer's count and counts it as invalid."""
    if usage is None:
        return None
    counts = {
        name: getattr(usage, name)
        for name in (
            "input_tokens",
            "output_tokens",
            "cached_input_tokens",
            "cache_write_tokens",
            "reasoning_tokens",
            "cache_write_1h_tokens",
        )
    }
    bad = {name for name, n in counts.items() if n is not None and not _plausible(n)}
    if not bad:
        return usage
    return dataclasses.replace(usage, estimated=True, **dict.fromkeys(bad))


def _plausible(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_TOKEN_COUNT
