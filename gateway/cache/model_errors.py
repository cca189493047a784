"""The error of a model that is not installed (importing this module loads nothing heavy)."""

from __future__ import annotations

from gateway.core.errors import NotConfiguredError


class ModelUnavailable(NotConfiguredError):
    """No int8 model here and none can be made: the message says what to install or run. An
    installation fault no client retry fixes (a 500 with ``x-should-retry: false``)."""

    code = "model_not_installed"
