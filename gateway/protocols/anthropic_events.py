"""Anthropic Messages out as SSE: chat chunks -> Anthropic stream events (``ChunkEncoder``,
for Messages clients served by a chat upstream), and a complete message -> the events a
streaming client would have got (``message_frames``, to replay a cache hit)."""

from __future__ import annotations

import json
from typing import Any

from gateway.core.types import Usage
from gateway.protocols.anthropic_messages import STOP_REASONS, message_id, usage_json


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
                self.stop_reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
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
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_sy{slot}",
                "name": fn.get("name") or "",
                "input": {},
            }
            out += self._open("tool", block)
            self._tools[slot] = self._next - 1
        if fn.get("arguments") and self._block == self._tools[slot]:
            out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def finish(self, usage: Usage) -> list[bytes]:
        out = self._close()
        final = usage_json(usage)
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
