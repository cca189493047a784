"""The one error tree. Every error knows its HTTP status, its OpenAI error type and whether a
retry against the same upstream may help. Messages must never contain secrets."""

from __future__ import annotations


class SwitchyardError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    retryable: bool = False
    # What the client's SDK should do: False sends ``x-should-retry: false`` (the openai and
    # anthropic SDKs obey it before their status rules, which retry 408, 409, 429 and >= 500).
    client_retry: bool | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def to_body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequestError(SwitchyardError):
    status = 400
    type = "invalid_request_error"


class AuthenticationError(SwitchyardError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDeniedError(SwitchyardError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFoundError(SwitchyardError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLargeError(SwitchyardError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeoutError(SwitchyardError):
    """The client did not send its whole request body in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class RateLimitError(SwitchyardError):
    """429 from Switchyard's own limits, or an upstream 429 once retries are exhausted."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    retryable = True


class UpstreamError(SwitchyardError):
    """The upstream answered with an error or garbage. 502 to the client."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int | None = None,
        retryable: bool | None = None,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code, retry_after=retry_after)
        self.upstream_status = upstream_status
        if retryable is not None:
            self.retryable = retryable


class UpstreamRejectedError(UpstreamError):
    """The upstream refused the request itself (4xx other than auth/429): the client's fault,
    passed through with the upstream's status. Not retryable, no fallback."""

    retryable = False

    def __init__(self, message: str, *, upstream_status: int, param: str | None = None) -> None:
        super().__init__(message, upstream_status=upstream_status, retryable=False, param=param)
        self.status = upstream_status if 400 <= upstream_status < 500 else 400
        self.type = "invalid_request_error"
        self.code = "upstream_rejected"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout_error"
    code = "upstream_timeout"


class ServiceUnavailableError(SwitchyardError):
    """No target could serve the request (all circuit breakers open, nothing configured)."""

    status = 503
    type = "service_unavailable"
    code = "no_healthy_upstream"
    retryable = True


class StreamBrokenError(UpstreamError):
    """The upstream stream ended or failed after bytes reached the client."""

    code = "stream_interrupted"


class UpstreamRateLimitedError(UpstreamError):
    """The upstream said 429. Retried (honouring Retry-After) and then the next target; if
    every target is exhausted the client sees 429 with Retry-After."""

    status = 429
    type = "rate_limit_error"
    code = "upstream_rate_limited"


class NotConfiguredError(SwitchyardError):
    """The operator's configuration cannot serve the request (a route whose providers have no
    API key). A 500 like any server-side fault, but one that no retry fixes: it says so with
    ``x-should-retry: false`` so the SDKs fail at once instead of retrying for seconds."""

    status = 500
    type = "server_error"
    code = "provider_not_configured"
    client_retry = False


class OverloadedError(SwitchyardError):
    """The gateway is at its in-flight bound (``server.max_in_flight``): shed at once."""

    status = 503
    type = "server_error"
    code = "overloaded"
    retryable = True


class StartingError(SwitchyardError):
    """The gateway is still starting (migrating its ledger, say): answered before any handler."""

    status = 503
    type = "server_error"
    code = "starting"
    retryable = True


class UnknownPathError(SwitchyardError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowedError(SwitchyardError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class InternalError(SwitchyardError):
    """A bug inside the gateway: the client learns no more than the request id."""

    status = 500
    type = "server_error"
    code = "internal_error"
