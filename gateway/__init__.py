"""Switchyard: a cost-aware, OpenAI-compatible LLM gateway."""

__version__ = "0.1.0"
