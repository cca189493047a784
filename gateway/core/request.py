"""The typed request record: one per request, whatever protocol it came in.

An inbound adapter (gateway/flow/adapters/) validates its wire body and translates it once
into this record; every step of the one pipeline (plan, limits, caches, model choice, budget
reservation, attempts, metering) reads its facts from here, never from the wire body. The
adapter keeps the wire body for a same-protocol pass-through; the record carries the facts.

``body`` is the request as an OpenAI chat body: the form the token counter, the cache keys,
the embedder and the classifier read, and what a chat upstream gets. Every part of the wire
request is in it (system prompts, tools, tool results; blocks a chat upstream cannot take as
their JSON text), so a budget counts an Anthropic or Responses request as it counts its chat
twin."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gateway.core.record import record


@record
class RequestRecord:
    protocol: str  # "chat" | "completions" | "messages" | "responses"
    model: str  # what the client sent as ``model``
    body: dict[str, Any]  # the request as an OpenAI chat body (route params applied by the flow)
    stream: bool
    include_usage: bool = False  # chat: stream_options.include_usage
    conversation_hint: str | None = None  # an explicit conversation key (prompt_cache_key, user_id...)
    task_header: str | None = None  # x-switchyard-task
    dropped: tuple[str, ...] = ()  # what a chat upstream has no place for (x-switchyard-dropped)

    @property
    def n(self) -> int:
        """How many answers the request asks for."""
        n = self.body.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters the request carries (after the route's params)."""
        return {k: self.body[k] for k in SAMPLING if self.body.get(k) is not None}

    def task(self) -> str:
        """What the request is for, per tenant: the ``x-switchyard-task`` header, else a
        fingerprint of its system prompt and tool names (``sys:<16 hex>``). One hash update per
        system message and tool, no serialisation of text content (it runs on every request)."""
        if self.task_header:
            return self.task_header
        digest = hashlib.blake2b(digest_size=8)
        for message in self.body.get("messages") or ():
            if _is_system(message):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
                digest.update(text.encode("utf-8", "surrogatepass"))
                digest.update(b"\x00")
        digest.update(b"\x01")
        for tool in self.body.get("tools") or ():
            fn = tool.get("function") if isinstance(tool, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            digest.update(str(name).encode("utf-8", "surrogatepass"))
            digest.update(b"\x00")
        return "sys:" + digest.hexdigest()


SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty")


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")
