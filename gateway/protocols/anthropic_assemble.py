"""A streamed Anthropic Messages answer put back together: the events (``message_start``,
``content_block_start``/``_delta``/``_stop``, ``message_delta``) fed one by one, the complete
message object out, as a non-streamed request would have got it (to store a streamed answer
in the exact cache and replay it later, as JSON or as events: anthropic_events.message_frames).

Deltas: ``text_delta`` (text), ``input_json_delta`` (a tool's input, parsed at the block's
stop), ``thinking_delta`` and ``signature_delta`` (kept byte for byte), ``citations_delta``
(appended to the block's citations). A block of another kind keeps its start as it came."""

from __future__ import annotations

import json
from typing import Any

Item = dict[str, Any]


class MessageAssembler:
    def __init__(self) -> None:
        self.message: Item | None = None
        self._blocks: dict[int, Item] = {}
        self._json: dict[int, list[str]] = {}
        self.complete = True  # False once something could not be put back (a tool's bad JSON)

    def add(self, data: Item) -> None:
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self.message = {**data["message"], "content": []}
        elif kind == "content_block_start" and isinstance(data.get("index"), int):
            block = data.get("content_block")
            self._blocks[data["index"]] = dict(block) if isinstance(block, dict) else {}
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            self._delta(data.get("index"), data["delta"])
        elif kind == "content_block_stop":
            self._stop(data.get("index"))
        elif kind == "message_delta" and self.message is not None:
            delta = data.get("delta")
            if isinstance(delta, dict):
                for name in ("stop_reason", "stop_sequence"):
                    if name in delta:
                        self.message[name] = delta[name]
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.message["usage"] = {**(self.message.get("usage") or {}), **usage}

    def _delta(self, index: Any, delta: Item) -> None:
        block = self._blocks.get(index) if isinstance(index, int) else None
        if block is None:
            self.complete = False
            return
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text", "")) + str(delta.get("text", ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking", "")) + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature", "")) + str(delta.get("signature", ""))
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            block.setdefault("citations", []).append(delta["citation"])
        else:
            self.complete = False  # a delta this gateway cannot put back: not stored

    def _stop(self, index: Any) -> None:
        if not isinstance(index, int) or index not in self._blocks:
            self.complete = False
            return
        pieces = self._json.pop(index, None)
        if pieces is not None:
            raw = "".join(pieces)
            try:
                self._blocks[index]["input"] = json.loads(raw) if raw else {}
            except ValueError:
                self.complete = False

    def result(self) -> Item | None:
        """The complete message (blocks in index order), or None when the stream did not
        give one back whole."""
        if self.message is None or not self.complete or self._json:
            return None
        return {**self.message, "content": [self._blocks[i] for i in sorted(self._blocks)]}
