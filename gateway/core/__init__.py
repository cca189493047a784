"""Plain dataclasses and the error tree. No I/O, no framework imports, nothing of ours."""

from gateway.core.errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    SwitchyardError,
    UpstreamError,
    UpstreamTimeoutError,
)

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ChatResult",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "SwitchyardError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "Usage",
]
