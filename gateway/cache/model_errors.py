"""The error of a model that is not installed (importing this module loads nothing heavy)."""

from __future__ import annotations


class ModelUnavailable(RuntimeError):
    """No int8 model here and none can be made: the message says what to install or run."""
