"""Turn a stream of chat chunks into one completion (to cache it), and a cached completion
back into chunks (to replay a hit to a streaming client)."""

from __future__ import annotations

from typing import Any


class _Call:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: list[str] = []
        self.arguments: list[str] = []

    def as_dict(self) -> dict[str, Any]:
        fn = {"name": "".join(self.name), "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": "function", "function": fn}


class _Choice:
    __slots__ = ("content", "finish_reason", "refusal", "role", "tool_calls")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, _Call] = {}
        self.finish_reason: str | None = None


class StreamAssembler:
    """Accumulates OpenAI chat.completion.chunk dicts into a chat.completion dict.

    Linear in the stream: the pieces of each text are collected in lists and joined once, in
    ``completion`` (string concatenation per chunk is quadratic in the number of chunks)."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.usage: dict[str, Any] | None = None
        self.system_fingerprint: str | None = None
        self._choices: dict[int, _Choice] = {}
        self.content_chars = 0

    def add(self, chunk: dict[str, Any]) -> None:
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.created = self.created or chunk.get("created")
        self.system_fingerprint = self.system_fingerprint or chunk.get("system_fingerprint")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            idx = choice.get("index", 0)
            acc = self._choices.get(idx)
            if acc is None:
                acc = self._choices[idx] = _Choice()
            delta = choice.get("delta") or {}
            if delta.get("role"):
                acc.role = delta["role"]
            piece = delta.get("content")
            if piece:
                acc.content.append(piece)
                self.content_chars += len(piece)
            if delta.get("refusal"):
                acc.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                slot = acc.tool_calls.get(call.get("index", 0))
                if slot is None:
                    slot = acc.tool_calls[call.get("index", 0)] = _Call()
                if call.get("id"):
                    slot.id = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot.name.append(fn["name"])
                if fn.get("arguments"):
                    slot.arguments.append(fn["arguments"])
                    self.content_chars += len(fn["arguments"])
            if choice.get("finish_reason"):
                acc.finish_reason = choice["finish_reason"]

    def completion(self) -> dict[str, Any]:
        choices = []
        for idx in sorted(self._choices):
            acc = self._choices[idx]
            message: dict[str, Any] = {
                "role": acc.role,
                "content": "".join(acc.content) if acc.content else None,
                "refusal": "".join(acc.refusal) if acc.refusal else None,
            }
            if acc.tool_calls:
                message["tool_calls"] = [acc.tool_calls[i].as_dict() for i in sorted(acc.tool_calls)]
            choices.append(
                {"index": idx, "message": message, "finish_reason": acc.finish_reason, "logprobs": None}
            )
        out: dict[str, Any] = {
            "id": self.id or "chatcmpl-switchyard",
            "object": "chat.completion",
            "created": self.created or 0,
            "model": self.model or "",
            "choices": choices,
        }
        if self.system_fingerprint:
            out["system_fingerprint"] = self.system_fingerprint
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def completion_to_chunks(completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The chunks a streaming client would have received for ``completion``."""
    base = {
        "id": completion.get("id", "chatcmpl-switchyard"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    chunks: list[dict[str, Any]] = []
    for choice in completion.get("choices") or ():
        idx = choice.get("index", 0)
        msg = choice.get("message") or {}
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": idx,
                        "delta": {"role": msg.get("role", "assistant"), "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
        if msg.get("content"):
            chunks.append(
                {
                    **base,
                    "choices": [
                        {
                            "index": idx,
                            "delta": {"content": msg["content"]},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        for i, call in enumerate(msg.get("tool_calls") or ()):
            delta = {
                "tool_calls": [
                    {"index": i, "id": call.get("id"), "type": "function", "function": call.get("function")}
                ]
            }
            chunks.append(
                {**base, "choices": [{"index": idx, "delta": delta, "logprobs": None, "finish_reason": None}]}
            )
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": idx,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": choice.get("finish_reason") or "stop",
                    }
                ],
            }
        )
    if include_usage and completion.get("usage"):
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks
