"""OpenAI wire format for the mock: chat completions, completions, embeddings, models."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from typing import Any

import orjson

from load_tests.mock_reply import (
    Generated,
    Reply,
    count_words,
    generate,
    json_reply,
    last_user_text,
    openai_error,
    part_text,
    requested_tool,
    split_fixed,
    stop_list,
)

MODELS = ("mock-small", "mock-large", "mock-embed")
EMBED_DIM = 8
ARG_PIECE_CHARS = 8
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _n(body: dict[str, Any]) -> int:
    n = body.get("n")
    return max(1, min(int(n), 128)) if isinstance(n, int) and not isinstance(n, bool) else 1


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _chosen_tool(body: dict[str, Any]) -> str | None:
    """Name of the tool the mock calls, or None to answer with text."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    messages = body.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "tool"
    ):
        return None  # a model answers the tool's result (an agent's loop ends)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str):
            return name
    first = tools[0] if isinstance(tools[0], dict) else {}
    name = (first.get("function") or {}).get("name") or first.get("name")
    return name if isinstance(name, str) else "tool"


def _finish(gen: Generated) -> str:
    return "stop" if gen.finish == "stop_sequence" else gen.finish


def chat_completion(body: dict[str, Any], tokens: int, rid: int, created: int) -> Reply:
    messages = body.get("messages")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return openai_error(400, "you must provide a model parameter", param="model")
    if not isinstance(messages, list) or not messages:
        return openai_error(400, "'messages' must be a non-empty array", param="messages")
    prompt_tokens = sum(count_words(part_text(m.get("content"))) for m in messages if isinstance(m, dict))
    user_text = last_user_text(messages)
    n = _n(body)
    cid = f"chatcmpl-mock{rid:010d}"
    tool = _chosen_tool(body)
    if tool is not None:
        args = json.dumps({"q": user_text})
        asked = requested_tool(user_text, body.get("tools"))
        if asked is not None:
            tool, args = asked[0], json.dumps(asked[1])
        call_id = f"call_mock{rid:010d}"
        if body.get("stream"):
            return _stream_tool(body, cid, created, model, n, tool, call_id, args, prompt_tokens)
        pieces = len(split_fixed(args, ARG_PIECE_CHARS))
        call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": args}}
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
        choices = [
            {"index": i, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
            for i in range(n)
        ]
        return _chat_body(cid, created, model, choices, _usage(prompt_tokens, pieces * n), pieces)
    gen = generate(user_text, tokens, _max_tokens(body), stop_list(body.get("stop")))
    if body.get("stream"):
        return _stream_text(body, cid, created, model, n, gen, prompt_tokens)
    message = {"role": "assistant", "content": gen.text, "refusal": None}
    choices = [
        {"index": i, "message": message, "logprobs": None, "finish_reason": _finish(gen)} for i in range(n)
    ]
    usage = _usage(prompt_tokens, len(gen.pieces) * n)
    return _chat_body(cid, created, model, choices, usage, max(0, len(gen.pieces) - 1))


def _chat_body(
    cid: str, created: int, model: str, choices: list[Any], usage: dict[str, Any], n_paced: int
) -> Reply:
    obj = {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage,
        "system_fingerprint": "fp_mock",
        "service_tier": "default",
    }
    return json_reply(200, obj, n_paced=n_paced)


class _ChunkWriter:
    """Builds ``chat.completion.chunk`` events with pre-serialised common fields."""

    def __init__(self, body: dict[str, Any], cid: str, created: int, model: str) -> None:
        opts = body.get("stream_options")
        self.include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        self._head = orjson.dumps(head)[:-1] + b',"system_fingerprint":"fp_mock",'
        self._tail = b',"usage":null}\n\n' if self.include_usage else b"}\n\n"
        self.events: list[bytes] = []
        self.paced: list[bool] = []

    def choice(self, index: int, delta: dict[str, Any], finish: str | None, paced: bool = False) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        self.raw(b'"choices":[' + orjson.dumps(choice) + b"]", paced)

    def raw(self, middle: bytes, paced: bool = False) -> None:
        self.events.append(b"data: " + self._head + middle + self._tail)
        self.paced.append(paced)

    def finish(self, prompt_tokens: int, completion_tokens: int) -> Reply:
        if self.include_usage:
            usage = orjson.dumps(_usage(prompt_tokens, completion_tokens))
            self.events.append(b"data: " + self._head + b'"choices":[],"usage":' + usage + b"}\n\n")
            self.paced.append(False)
        self.events.append(DONE)
        self.paced.append(False)
        return Reply(
            status=200,
            content_type="text/event-stream; charset=utf-8",
            events=tuple(self.events),
            paced=tuple(self.paced),
        )


def _stream_text(
    body: dict[str, Any], cid: str, created: int, model: str, n: int, gen: Generated, prompt_tokens: int
) -> Reply:
    out = _ChunkWriter(body, cid, created, model)
    for i in range(n):
        out.choice(i, {"role": "assistant", "content": "", "refusal": None}, None)
    for k, piece in enumerate(gen.pieces):
        for i in range(n):
            out.choice(i, {"content": piece}, None, paced=(k > 0 and i == 0))
    for i in range(n):
        out.choice(i, {}, _finish(gen))
    return out.finish(prompt_tokens, len(gen.pieces) * n)


def _stream_tool(
    body: dict[str, Any],
    cid: str,
    created: int,
    model: str,
    n: int,
    tool: str,
    call_id: str,
    args: str,
    prompt_tokens: int,
) -> Reply:
    out = _ChunkWriter(body, cid, created, model)
    pieces = split_fixed(args, ARG_PIECE_CHARS)
    for i in range(n):
        first = {"index": 0, "id": call_id, "type": "function", "function": {"name": tool, "arguments": ""}}
        out.choice(i, {"role": "assistant", "content": None, "tool_calls": [first]}, None)
    for k, piece in enumerate(pieces):
        for i in range(n):
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            out.choice(i, delta, None, paced=(k > 0 and i == 0))
    for i in range(n):
        out.choice(i, {}, "tool_calls")
    return out.finish(prompt_tokens, len(pieces) * n)


def completion(body: dict[str, Any], tokens: int, rid: int, created: int) -> Reply:
    model = body.get("model")
    prompt = body.get("prompt", "")
    if not isinstance(model, str) or not model:
        return openai_error(400, "you must provide a model parameter", param="model")
    prompts = prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
    texts = [p if isinstance(p, str) else " ".join(map(str, p)) for p in prompts] or [""]
    n = _n(body)
    gens = [generate(t, tokens, _max_tokens(body), stop_list(body.get("stop"))) for t in texts]
    prompt_tokens = sum(count_words(t) for t in texts)
    completion_tokens = sum(len(g.pieces) for g in gens) * n
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    usage["total_tokens"] = prompt_tokens + completion_tokens
    head = {"id": f"cmpl-mock{rid:010d}", "object": "text_completion", "created": created, "model": model}
    pairs = [(g, j * n + i) for j, g in enumerate(gens) for i in range(n)]
    if body.get("stream"):
        events: list[bytes] = []
        paced: list[bool] = []
        longest = max(len(g.pieces) for g in gens)
        for k in range(longest):
            for gen, idx in pairs:
                if k < len(gen.pieces):
                    choice = {"text": gen.pieces[k], "index": idx, "logprobs": None, "finish_reason": None}
                    events.append(sse({**head, "choices": [choice]}))
                    paced.append(k > 0 and idx == 0)
        for gen, idx in pairs:
            choice = {"text": "", "index": idx, "logprobs": None, "finish_reason": _finish(gen)}
            events.append(sse({**head, "choices": [choice]}))
            paced.append(False)
        events.append(DONE)
        paced.append(False)
        return Reply(
            content_type="text/event-stream; charset=utf-8", events=tuple(events), paced=tuple(paced)
        )
    choices = [
        {"text": g.text, "index": idx, "logprobs": None, "finish_reason": _finish(g)} for g, idx in pairs
    ]
    n_paced = max(0, max(len(g.pieces) for g in gens) - 1)
    return json_reply(200, {**head, "choices": choices, "usage": usage}, n_paced=n_paced)


def embedding_vector(text: str, dim: int = EMBED_DIM) -> list[float]:
    """Deterministic unit vector (float32 values) derived from a hash of the text."""
    raw = b""
    counter = 0
    while len(raw) < 4 * dim:
        raw += hashlib.blake2b(text.encode(), digest_size=64, salt=counter.to_bytes(16, "little")).digest()
        counter += 1
    ints = struct.unpack(f"<{dim}I", raw[: 4 * dim])
    vec = [(v / 0xFFFFFFFF) * 2.0 - 1.0 for v in ints]
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    packed = struct.pack(f"<{dim}f", *(x / norm for x in vec))
    return list(struct.unpack(f"<{dim}f", packed))


def embeddings(body: dict[str, Any], rid: int) -> Reply:
    model = body.get("model")
    raw = body.get("input")
    if not isinstance(model, str) or not model:
        return openai_error(400, "you must provide a model parameter", param="model")
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        inputs = [" ".join(map(str, raw))]
    elif isinstance(raw, list) and raw:
        inputs = [x if isinstance(x, str) else " ".join(map(str, x)) for x in raw]
    else:
        return openai_error(400, "'input' must be a string or a non-empty array", param="input")
    dims = body.get("dimensions")
    dim = dims if isinstance(dims, int) and 1 <= dims <= 4096 else EMBED_DIM
    as_b64 = body.get("encoding_format") == "base64"
    data = []
    for i, text in enumerate(inputs):
        vec = embedding_vector(text, dim)
        value: Any = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode() if as_b64 else vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(count_words(t) for t in inputs)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json_reply(200, {"object": "list", "data": data, "model": model, "usage": usage})


def models(created: int, model_id: str | None = None) -> Reply:
    items = [{"id": m, "object": "model", "created": created, "owned_by": "mock"} for m in MODELS]
    if model_id is None:
        return json_reply(200, {"object": "list", "data": items})
    for item in items:
        if item["id"] == model_id:
            return json_reply(200, item)
    return openai_error(404, f"The model '{model_id}' does not exist")


def status_body(status: int, message: str) -> bytes:
    etype = {401: "authentication_error", 429: "rate_limit_exceeded"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return orjson.dumps({"error": {"message": message, "type": etype, "param": None, "code": None}})


def huge_chat(model: str, rid: int, created: int, size: int) -> Reply:
    message = {"role": "assistant", "content": "x" * size, "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return _chat_body(f"chatcmpl-mock{rid:010d}", created, model, [choice], _usage(0, 1), 0)
