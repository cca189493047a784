"""Anthropic Messages SSE events -> OpenAI ``chat.completion.chunk`` dicts. Pure, no I/O.

Feed each parsed event (event name + data dict) to ``StreamTranslator.feed``; it returns the
chunks to emit. Usage comes from message_start, updated by message_delta (whose counts are
cumulative), and is emitted as a usage-only chunk (``choices == []``) at message_stop.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.core.errors import StreamBrokenError
from gateway.core.redact import redact
from gateway.core.types import Usage, usage_from_anthropic
from gateway.providers.anthropic_wire import finish_reason

_RETRYABLE_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StreamTranslator:
    """Feed parsed Anthropic SSE events one at a time; get the OpenAI chunks to emit."""

    def __init__(self, model: str, *, provider: str = "anthropic", created: int | None = None) -> None:
        self.model = model
        self.provider = provider
        self.created = int(time.time()) if created is None else created
        self.id: str | None = None
        self.usage: Usage | None = None
        self.finished = False
        self._raw_usage: dict[str, Any] = {}
        self._tool_index: dict[int, int] = {}  # Anthropic content block index -> OpenAI tool call index
        self._tool_input: dict[int, Any] = {}
        self._args_sent: set[int] = set()
        self._finish_sent = False

    def feed(self, event: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        kind = data.get("type") if isinstance(data.get("type"), str) else event
        if self.finished or kind == "ping":
            return []
        if kind == "error":
            raise self._error(data.get("error"))
        if kind == "message_start":
            return self._message_start(data.get("message"))
        if kind in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
            if self.id is None:
                raise self._broken(f"sent {kind} before message_start")
            index = _int(data.get("index"))
            if kind == "content_block_start":
                return self._block_start(index, data.get("content_block"))
            if kind == "content_block_delta":
                return self._block_delta(index, data.get("delta"))
            if kind == "content_block_stop":
                return self._block_stop(index)
            return self._message_delta(data)
        if kind == "message_stop":
            return self._message_stop()
        return []  # unknown event types are ignored, as Anthropic's versioning policy asks

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    def _broken(self, what: str) -> StreamBrokenError:
        return StreamBrokenError(f"upstream '{self.provider}' {what}")

    def _error(self, err: Any) -> StreamBrokenError:
        etype = err.get("type") if isinstance(err, dict) else None
        etype = etype if isinstance(etype, str) else "unknown_error"
        detail = err.get("message") if isinstance(err, dict) else None
        suffix = f": {redact(detail[:300])}" if isinstance(detail, str) and detail else ""
        exc = self._broken(f"reported a stream error ({etype}){suffix}")
        exc.retryable = etype in _RETRYABLE_STREAM_ERRORS
        return exc

    def _message_start(self, message: Any) -> list[dict[str, Any]]:
        if self.id is not None:
            return []
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            raise self._broken("sent a message_start without a message id")
        self.id = message["id"]
        if isinstance(message.get("usage"), dict):
            self._raw_usage = dict(message["usage"])
            self.usage = usage_from_anthropic(self._raw_usage)
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block_start(self, index: int | None, block: Any) -> list[dict[str, Any]]:
        if not isinstance(block, dict) or index is None:
            raise self._broken("sent a malformed content_block_start")
        if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
            return [self._chunk({"content": block["text"]})]
        if block.get("type") != "tool_use":
            return []
        call_index = len(self._tool_index)
        self._tool_index[index] = call_index
        self._tool_input[index] = block.get("input")
        call = {"index": call_index, "id": block.get("id"), "type": "function"}
        call["function"] = {"name": block.get("name"), "arguments": ""}
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, index: int | None, delta: Any) -> list[dict[str, Any]]:
        if not isinstance(delta, dict):
            raise self._broken("sent a malformed content_block_delta")
        if delta.get("type") == "text_delta":
            text = delta.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if delta.get("type") == "input_json_delta" and index in self._tool_index:
            piece = delta.get("partial_json")
            if not isinstance(piece, str) or not piece:
                return []
            self._args_sent.add(index)
            call = {"index": self._tool_index[index], "function": {"arguments": piece}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # thinking, signature and citation deltas have no OpenAI equivalent

    def _block_stop(self, index: int | None) -> list[dict[str, Any]]:
        if index is None or index not in self._tool_index or index in self._args_sent:
            return []
        # A tool call without argument deltas: send what the start carried (at least "{}").
        self._args_sent.add(index)
        given = self._tool_input.get(index)
        arguments = json.dumps(given if isinstance(given, dict) else {})
        call = {"index": self._tool_index[index], "function": {"arguments": arguments}}
        return [self._chunk({"tool_calls": [call]})]

    def _message_delta(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        raw = data.get("usage")
        if isinstance(raw, dict):  # message_delta usage counts are cumulative: the latest wins
            self._raw_usage.update({k: v for k, v in raw.items() if v is not None})
            self.usage = usage_from_anthropic(self._raw_usage)
        delta = data.get("delta")
        stop = delta.get("stop_reason") if isinstance(delta, dict) else None
        if stop is None or self._finish_sent:
            return []
        self._finish_sent = True
        return [self._chunk({}, finish_reason(stop))]

    def _message_stop(self) -> list[dict[str, Any]]:
        if self.id is None:
            raise self._broken("sent message_stop before message_start")
        self.finished = True
        out = [] if self._finish_sent else [self._chunk({}, "stop")]
        self._finish_sent = True
        if self.usage is not None:
            out.append(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": self.usage.to_openai(),
                }
            )
        return out
