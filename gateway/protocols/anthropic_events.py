"""Anthropic Messages streams (SSE events) <-> OpenAI chat chunks, both directions:

- out to a Messages client: chat chunks -> Anthropic stream events (``ChunkEncoder``, for
  Messages clients served by a chat upstream), and a complete message -> the events a
  streaming client would have got (``message_frames``, to replay a cache hit);
- in from an Anthropic upstream: its parsed events -> chat chunks (``StreamTranslator``, for
  chat clients served by providers/anthropic.py).

Stop reasons, usage and the tool call shapes come from ``anthropic_format``."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.core.errors import StreamBrokenError
from gateway.core.redact import redact
from gateway.core.types import Usage
from gateway.protocols import anthropic_format as fmt
from gateway.protocols.anthropic_messages import message_id


# ----------------------------------------------------------------------------- chunks -> events
def frame(event: str, data: dict[str, Any] | bytes) -> bytes:
    """One SSE event in Anthropic's framing (``event:`` line, then ``data:``)."""
    raw = (
        data
        if isinstance(data, bytes)
        else json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    )
    return b"event: " + event.encode() + b"\ndata: " + raw + b"\n\n"


class ChunkEncoder:
    """OpenAI chat chunks in, Anthropic SSE frames out (text and tool_use blocks, one choice)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._started = False
        self._block: int | None = None  # index of the open content block
        self._kind: str | None = None  # "text" | "tool"
        self._tools: dict[int, int] = {}  # chat tool-call index -> content block index
        self._next = 0
        self.stop_reason = "end_turn"

    def start(self, chunk: dict[str, Any]) -> list[bytes]:
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        self._started = True
        return [frame("message_start", {"type": "message_start", "message": message})]

    def add(self, chunk: dict[str, Any]) -> list[bytes]:
        out = [] if self._started else self.start(chunk)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._open("text", None)
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.stop_reason = fmt.stop_reason(choice["finish_reason"])
        return out

    def _open(self, kind: str, block: dict[str, Any] | None) -> list[bytes]:
        if self._kind == kind and kind == "text":
            return []
        out = self._close()
        self._block, self._kind = self._next, kind
        self._next += 1
        start = block or {"type": "text", "text": ""}
        out.append(
            frame(
                "content_block_start",
                {"type": "content_block_start", "index": self._block, "content_block": start},
            )
        )
        return out

    def _close(self) -> list[bytes]:
        if self._block is None:
            return []
        index, self._block, self._kind = self._block, None, None
        return [frame("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return frame(
            "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
        )

    def _tool_delta(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        slot = call.get("index", 0)
        fn = call.get("function") or {}
        if slot not in self._tools:
            out += self._open(
                "tool", fmt.tool_use(call.get("id") or f"toolu_sy{slot}", fn.get("name") or "", {})
            )
            self._tools[slot] = self._next - 1
        if fn.get("arguments") and self._block == self._tools[slot]:
            out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def finish(self, usage: Usage) -> list[bytes]:
        out = self._close()
        final = fmt.usage_json(usage)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": final["output_tokens"], "input_tokens": final["input_tokens"]},
        }
        out.append(frame("message_delta", delta))
        out.append(frame("message_stop", {"type": "message_stop"}))
        return out


def message_frames(message: dict[str, Any]) -> list[bytes]:
    """A complete Anthropic message as the SSE events a streaming client would have got
    (to replay a cache hit to a streaming client)."""
    start = {**message, "content": [], "stop_reason": None}
    out = [frame("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(message.get("content") or ()):
        opening, deltas = _block_events(block)
        out.append(
            frame(
                "content_block_start", {"type": "content_block_start", "index": i, "content_block": opening}
            )
        )
        for delta in deltas:
            out.append(
                frame("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
            )
        out.append(frame("content_block_stop", {"type": "content_block_stop", "index": i}))
    usage = message.get("usage") or {}
    final = {
        "type": "message_delta",
        "delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": None},
        "usage": {"output_tokens": usage.get("output_tokens", 0)},
    }
    out += [frame("message_delta", final), frame("message_stop", {"type": "message_stop"})]
    return out


def _block_events(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block as its opening (``content_block_start``) and its deltas."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": block.get("text", "")}]
    if kind == "tool_use":
        args = json.dumps(block.get("input") or {}, ensure_ascii=False)
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": args}]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    return block, []  # redacted_thinking and other whole blocks arrive complete in their start


# ----------------------------------------------------------------------------- events -> chunks
class StreamTranslator:
    """Feed parsed Anthropic SSE events (event name + data dict) one at a time; get the OpenAI
    chunks to emit. Usage comes from message_start, updated by message_delta (whose counts are
    cumulative), and is emitted as a usage-only chunk (``choices == []``) at message_stop."""

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
            index = fmt.int_or_none(data.get("index"))
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
        exc.retryable = etype in fmt.RETRYABLE_ERROR_TYPES
        return exc

    def _message_start(self, message: Any) -> list[dict[str, Any]]:
        if self.id is not None:
            return []
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            raise self._broken("sent a message_start without a message id")
        self.id = message["id"]
        if isinstance(message.get("usage"), dict):
            self._raw_usage = dict(message["usage"])
            self.usage = fmt.usage_from_anthropic(self._raw_usage)
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
        call = {"index": call_index, **fmt.tool_call(block.get("id"), block.get("name"), "")}
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
            self.usage = fmt.usage_from_anthropic(self._raw_usage)
        delta = data.get("delta")
        stop = delta.get("stop_reason") if isinstance(delta, dict) else None
        if stop is None or self._finish_sent:
            return []
        self._finish_sent = True
        return [self._chunk({}, fmt.finish_reason(stop))]

    def _message_stop(self) -> list[dict[str, Any]]:
        if self.id is None:
            raise self._broken("sent message_stop before message_start")
        self.finished = True
        out = [] if self._finish_sent else [self._chunk({}, "stop")]
        self._finish_sent = True
        if self.usage is not None:
            out.append({**self._chunk({}), "choices": [], "usage": self.usage.to_openai()})
        return out
