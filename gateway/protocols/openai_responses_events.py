"""OpenAI Responses stream events from chat chunks: ``response.created`` and
``response.in_progress``, then per output item ``response.output_item.added``, its deltas
(``response.reasoning_text.*`` for an upstream's ``reasoning_content``, ``content_part.*`` and
``output_text.*`` for text, ``refusal.*`` for a refusal, ``function_call_arguments.*`` for
tool calls) and ``response.output_item.done``; ``response.completed`` (or
``response.incomplete``) with the whole Response last; an ``error`` event when the stream
breaks. Every event carries its ``sequence_number``; each is framed as ``event: <type>`` +
``data: <json>``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from gateway.core.errors import SwitchyardError
from gateway.core.types import Usage
from gateway.protocols.openai_responses import (
    Item,
    finished,
    function_call_item,
    in_namespace,
    namespaces,
    new_id,
    reasoning_item,
    text_part,
)


def frame(event: Item) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def raw_frame(kind: str, data: bytes) -> bytes:
    """An upstream's event re-framed with its data bytes as they came."""
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class EventEncoder:
    """Chat chunks in, Responses stream events out: ``start`` (created, in_progress), ``add``
    per chunk (items opened, text and argument deltas), ``finish`` (items closed, completed),
    ``error`` (the stream broke)."""

    def __init__(self, response: Item) -> None:
        self.response = response
        self.seq = 0
        self.output: list[Item] = []
        self._text: Item | None = None  # the open message item
        self._text_index = 0
        self._reasoning: Item | None = None  # the open reasoning item (reasoning_content deltas)
        self._reasoning_index = 0
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index
        self._open_calls: list[int] = []
        self.finish_reason: str | None = None
        self._ns = namespaces(response.get("tools"))

    def _ev(self, kind: str, **fields: Any) -> Item:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> Iterator[Item]:
        yield self._ev("response.created", response=self.response)
        yield self._ev("response.in_progress", response=self.response)

    def add(self, chunk: dict[str, Any]) -> Iterator[Item]:
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                yield from self._reasoning_delta(thought)
            if delta.get("content") or delta.get("refusal") or delta.get("tool_calls"):
                yield from self._close_reasoning()
            if delta.get("content"):
                yield from self._part_delta("output_text", str(delta["content"]))
            if delta.get("refusal"):
                yield from self._part_delta("refusal", str(delta["refusal"]))
            for call in delta.get("tool_calls") or []:
                yield from self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _reasoning_delta(self, text: str) -> Iterator[Item]:
        if self._reasoning is None:
            self._reasoning = reasoning_item("", "in_progress")
            self._reasoning_index = len(self.output)
            self.output.append(self._reasoning)
            added = dict(self._reasoning, content=[])
            yield self._ev("response.output_item.added", output_index=self._reasoning_index, item=added)
        self._reasoning["content"][0]["text"] += text
        yield self._ev(
            "response.reasoning_text.delta",
            item_id=self._reasoning["id"],
            output_index=self._reasoning_index,
            content_index=0,
            delta=text,
        )

    def _close_reasoning(self) -> Iterator[Item]:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return
        index, text = self._reasoning_index, item["content"][0]["text"]
        yield self._ev(
            "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text
        )
        item["status"] = "completed"
        yield self._ev("response.output_item.done", output_index=index, item=item)

    def _part_delta(self, kind: str, text: str) -> Iterator[Item]:
        """A text (``output_text``) or refusal delta of the message item, opened on first use."""
        if self._text is None:
            self._text = {
                "type": "message",
                "id": new_id("msg"),
                "role": "assistant",
                "status": "in_progress",
            }
            self._text["content"] = []
            self._text_index = len(self.output)
            self.output.append(self._text)
            added = dict(self._text, content=[])
            yield self._ev("response.output_item.added", output_index=self._text_index, item=added)
        parts: list[Item] = self._text["content"]
        index = next((n for n, p in enumerate(parts) if p["type"] == kind), None)
        if index is None:
            part = (
                text_part("output_text", "") if kind == "output_text" else {"type": "refusal", "refusal": ""}
            )
            index = len(parts)
            parts.append(part)
            yield self._ev(
                "response.content_part.added",
                item_id=self._text["id"],
                output_index=self._text_index,
                content_index=index,
                part=dict(part),
            )
        where = {"item_id": self._text["id"], "output_index": self._text_index, "content_index": index}
        if kind == "output_text":
            parts[index]["text"] += text
            yield self._ev("response.output_text.delta", **where, delta=text, logprobs=[])
        else:
            parts[index]["refusal"] += text
            yield self._ev("response.refusal.delta", **where, delta=text)

    def _call_delta(self, call: dict[str, Any]) -> Iterator[Item]:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if index not in self._calls:
            item = function_call_item(
                str(call.get("id") or new_id("call")), str(fn.get("name") or ""), "", "in_progress"
            )
            in_namespace(item, self._ns)
            self._calls[index] = len(self.output)
            self._open_calls.append(len(self.output))
            self.output.append(item)
            yield self._ev("response.output_item.added", output_index=self._calls[index], item=dict(item))
        out_index = self._calls[index]
        item = self.output[out_index]
        if fn.get("name") and not item["name"]:
            item["name"] = fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            yield self._ev(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=out_index,
                delta=fn["arguments"],
            )

    def finish(self, usage: Usage) -> Iterator[Item]:
        yield from self._close_reasoning()
        if self._text is not None:
            item, index = self._text, self._text_index
            for n, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": index, "content_index": n}
                if part["type"] == "output_text":
                    yield self._ev("response.output_text.done", **where, text=part["text"], logprobs=[])
                else:
                    yield self._ev("response.refusal.done", **where, refusal=part["refusal"])
                yield self._ev("response.content_part.done", **where, part=part)
            item["status"] = "completed"
            yield self._ev("response.output_item.done", output_index=index, item=item)
        for index in self._open_calls:
            item = in_namespace(self.output[index], self._ns)
            yield self._ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=item["arguments"],
            )
            item["status"] = "completed"
            yield self._ev("response.output_item.done", output_index=index, item=item)
        self.response = finished(self.response, self.output, self.finish_reason, usage)
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        yield self._ev(kind, response=self.response)

    def error(self, exc: SwitchyardError) -> Item:
        return self._ev("error", code=exc.code, message=exc.message, param=exc.param)
