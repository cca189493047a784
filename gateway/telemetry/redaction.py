"""Log redaction: secrets never reach a log line, whatever code logs them."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gateway.core.redact import redact


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        return redact(text, self._secrets)


class RedactingFilter(logging.Filter):
    """Renders each record's message once, redacted, so arguments cannot leak either."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = None
        record.msg = self.redactor(message)
        record.args = None
        return True


def install(redactor: Redactor) -> None:
    """Attach the redacting filter to every handler of the root and uvicorn loggers."""
    filt = RedactingFilter(redactor)
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "switchyard"):
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
                handler.removeFilter(old)
            handler.addFilter(filt)
        for old in [f for f in logger.filters if isinstance(f, RedactingFilter)]:
            logger.removeFilter(old)
        logger.addFilter(filt)
