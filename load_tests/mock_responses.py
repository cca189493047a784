"""OpenAI Responses API wire format for the mock (``POST /v1/responses``): a Response object,
or its typed SSE events (``event: <type>`` + ``data: {...}``, ``sequence_number`` counting up).

The reply follows the mock's echo rule (mock_reply.generate) over the last user text. A
function tool is called unless the last input item is a ``function_call_output``. With
``reasoning.effort`` set (not ``none``), a reasoning item comes first and its
``REASONING_TOKENS`` count in ``output_tokens`` (as OpenAI counts them); with
``include: ["reasoning.encrypted_content"]`` the item carries an opaque ``encrypted_content``.
A ``prompt_cache_key`` seen before reports every input token but the last item's as cached.
The mock keeps nothing: ``previous_response_id`` is refused (the gateway keeps the chain)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from load_tests.mock_reply import (
    Reply,
    count_words,
    generate,
    json_reply,
    openai_error,
    part_text,
    split_fixed,
)

REASONING_TOKENS = 8
ARG_PIECE_CHARS = 8
ENCRYPTED = "reasoning.encrypted_content"


def _items(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return [i for i in raw if isinstance(i, dict)] if isinstance(raw, list) else []


def _item_text(item: dict[str, Any]) -> str:
    if item.get("type") == "function_call_output":
        return part_text(item.get("output"))
    if item.get("type") == "function_call":
        return str(item.get("arguments") or "")
    return part_text(item.get("content"))


def _last_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("role") == "user":
            return part_text(item.get("content"))
    return ""


def _tool(body: dict[str, Any], items: list[dict[str, Any]]) -> str | None:
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    if not tools or body.get("tool_choice") == "none":
        return None
    if items and items[-1].get("type") == "function_call_output":
        return None
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return str(choice["name"])
    return str(tools[0].get("name") or "tool")


def _usage(prompt: int, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


class _Answer:
    """The reply's items, built once and sent whole or as events."""

    def __init__(
        self, body: dict[str, Any], tokens: int, rid: int, cache_lookup: Callable[[str], bool]
    ) -> None:
        items = _items(body)
        self.body = body
        self.rid = f"resp_mock{rid:010d}"
        self.created = int(time.time())
        words = [count_words(_item_text(i)) for i in items]
        prompt = sum(words) + count_words(str(body.get("instructions") or ""))
        key = body.get("prompt_cache_key")
        seen = isinstance(key, str) and cache_lookup("responses:" + key)
        self.cached = prompt - words[-1] if seen else 0
        effort = (
            (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
        )
        self.reasoning = effort not in (None, "none")
        self.encrypted = self.reasoning and ENCRYPTED in (body.get("include") or [])
        self.tool = _tool(body, items)
        user = _last_user_text(items)
        limit = body.get("max_output_tokens")
        self.gen = generate(user, tokens, limit if isinstance(limit, int) else None, [])
        self.args = json.dumps({"q": user})
        self.prompt = prompt
        self.digest = hashlib.sha256(orjson.dumps(items)).digest()

    @property
    def output_tokens(self) -> int:
        reasoning = REASONING_TOKENS if self.reasoning else 0
        if self.tool is not None:
            return reasoning + len(split_fixed(self.args, ARG_PIECE_CHARS))
        return reasoning + len(self.gen.pieces)

    @property
    def incomplete(self) -> bool:
        return self.tool is None and self.gen.finish == "length"

    def reasoning_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"id": f"rs_{self.rid[5:]}", "type": "reasoning", "summary": []}
        if self.encrypted:
            item["encrypted_content"] = "gAAAA" + base64.b64encode(self.digest * 3).decode()
        return item

    def message(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "id": f"msg_{self.rid[5:]}",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [part] if status == "completed" else [],
        }

    def call(self, arguments: str, status: str) -> dict[str, Any]:
        return {
            "id": f"fc_{self.rid[5:]}",
            "type": "function_call",
            "status": status,
            "call_id": f"call_{self.rid[5:]}",
            "name": self.tool,
            "arguments": arguments,
        }

    def output(self) -> list[dict[str, Any]]:
        out = [self.reasoning_item()] if self.reasoning else []
        out.append(
            self.call(self.args, "completed") if self.tool else self.message(self.gen.text, "completed")
        )
        return out

    def response(self, status: str, output: list[dict[str, Any]], done: bool) -> dict[str, Any]:
        body = self.body
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        usage = _usage(
            self.prompt, self.cached, self.output_tokens, REASONING_TOKENS if self.reasoning else 0
        )
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if done and self.incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, **text},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage if done else None,
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    def final_status(self) -> str:
        return "incomplete" if self.incomplete else "completed"


class _Events:
    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.paced: list[bool] = []

    def add(self, kind: str, paced: bool = False, **fields: Any) -> None:
        data = {"type": kind, "sequence_number": len(self.events), **fields}
        self.events.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")
        self.paced.append(paced)


def responses(body: dict[str, Any], tokens: int, rid: int, cache_lookup: Callable[[str], bool]) -> Reply:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return openai_error(400, "Missing required parameter: 'model'.", param="model")
    if body.get("previous_response_id") is not None:
        return openai_error(
            404,
            f"Previous response with id '{body['previous_response_id']}' not found.",
            param="previous_response_id",
        )
    if not _items(body):
        return openai_error(400, "Missing required parameter: 'input'.", param="input")
    answer = _Answer(body, tokens, rid, cache_lookup)
    if not body.get("stream"):
        obj = answer.response(answer.final_status(), answer.output(), True)
        return json_reply(200, obj, n_paced=max(0, answer.output_tokens - 1))
    return _stream(answer)


def _stream(a: _Answer) -> Reply:
    out = _Events()
    out.add("response.created", response=a.response("in_progress", [], False))
    out.add("response.in_progress", response=a.response("in_progress", [], False))
    index = 0
    if a.reasoning:
        item = a.reasoning_item()
        out.add("response.output_item.added", output_index=0, item={**item, "summary": []})
        out.add("response.output_item.done", output_index=0, item=item)
        index = 1
    if a.tool is not None:
        item_id = f"fc_{a.rid[5:]}"
        out.add("response.output_item.added", output_index=index, item=a.call("", "in_progress"))
        for k, piece in enumerate(split_fixed(a.args, ARG_PIECE_CHARS)):
            out.add(
                "response.function_call_arguments.delta",
                k > 0,
                item_id=item_id,
                output_index=index,
                delta=piece,
            )
        out.add(
            "response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=a.args
        )
        out.add("response.output_item.done", output_index=index, item=a.call(a.args, "completed"))
    else:
        item_id = f"msg_{a.rid[5:]}"
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        out.add("response.output_item.added", output_index=index, item=a.message("", "in_progress"))
        out.add("response.content_part.added", **where, part=empty)
        for k, piece in enumerate(a.gen.pieces):
            out.add("response.output_text.delta", k > 0, **where, delta=piece, logprobs=[])
        out.add("response.output_text.done", **where, text=a.gen.text, logprobs=[])
        out.add("response.content_part.done", **where, part={**empty, "text": a.gen.text})
        out.add("response.output_item.done", output_index=index, item=a.message(a.gen.text, "completed"))
    status = a.final_status()
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    out.add(kind, response=a.response(status, a.output(), True))
    return Reply(
        content_type="text/event-stream; charset=utf-8", events=tuple(out.events), paced=tuple(out.paced)
    )
