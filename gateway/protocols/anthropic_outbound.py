"""OpenAI chat -> Anthropic Messages, for chat clients served by an Anthropic upstream
(providers/anthropic.py sends and reads what this writes): a chat request as a Messages
request (``to_anthropic_request``, ``add_cache_breakpoints``), and the Messages answer as a
chat completion (``from_anthropic_response``). Pure functions, no I/O. The facts this shares
with the inbound direction (stop reasons, usage, system, images, tools, tool choice, tool
calls and results) are in ``anthropic_format``; the answer's stream is read by
``anthropic_events.StreamTranslator``.

Decisions worth knowing:
- Fields that change the meaning of a request and that Anthropic cannot honour (``n`` > 1,
  ``logprobs``/``top_logprobs``, ``logit_bias``, legacy ``functions``/``function_call``, audio
  output) raise ``BadRequestError`` naming the field. Every other OpenAI-only field (seed,
  penalties, store, metadata, stream_options, service_tier, prediction, ...) is dropped.
- ``response_format`` of type ``json_object``/``json_schema`` becomes a trailing system text
  block asking for JSON only (with the schema, when given). This is best effort: the output is
  not validated and ``strict`` is not guaranteed.
- ``temperature`` is clamped into Anthropic's 0..1; when it is given, ``top_p`` is dropped
  (recent Claude models reject the two together).
- System/developer messages anywhere in the conversation are hoisted into ``system``.
- Response ids are the Anthropic message ids, unchanged (kept for correlation).
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.core.errors import BadRequestError, UpstreamError
from gateway.core.types import ChatResult, Usage
from gateway.protocols import anthropic_format as fmt

DEFAULT_MAX_TOKENS = 4096


class MalformedResponseError(UpstreamError):
    """The upstream's body does not look like an Anthropic message (the text is safe to show)."""

    code = "upstream_bad_response"


# ---------------------------------------------------------------- request: OpenAI -> Anthropic


def to_anthropic_request(
    body: dict[str, Any], upstream_model: str, *, stream: bool | None = None
) -> dict[str, Any]:
    """Translate an OpenAI chat request body into an Anthropic Messages request body.
    ``stream`` overrides ``body["stream"]`` when given."""
    _reject_unsupported(body)
    system, messages = _convert_messages(body.get("messages"))
    instruction = _response_format_instruction(body.get("response_format"))
    if instruction:
        system.append({"type": "text", "text": instruction})
    out: dict[str, Any] = {"model": upstream_model, "max_tokens": _max_tokens(body), "messages": messages}
    if system:
        out["system"] = system
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        out["temperature"] = min(max(float(temperature), 0.0), 1.0)
    top_p = body.get("top_p")
    if isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and "temperature" not in out:
        out["top_p"] = top_p  # recent Claude models reject temperature and top_p together
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stop_sequences"] = [s for s in stop if isinstance(s, str)]
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    tools = body.get("tools")
    if tools:
        out["tools"] = fmt.tools_to_anthropic(tools)
        choice = fmt.tool_choice_to_anthropic(body.get("tool_choice"), body.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    if body.get("stream") if stream is None else stream:
        out["stream"] = True
    return out


# Automatic prompt caching for chat clients (providers.X.auto_cache_control). Break-even: a
# 5-minute cache write costs 1.25x the input price, a read 0.1x. Marking a prefix of P tokens
# costs 0.25 P once and saves 0.9 P on every reuse within 5 minutes, so one reuse already pays
# (0.25 / 0.9 = 0.28 reuses). A conversation's next turn reuses system, tools and all earlier
# turns, so a multi-turn chat pays from its second request. Anthropic caches nothing below
# its minimum prefix (1,024 tokens on most models): shorter prefixes are left unmarked, so a
# one-off short request never pays the premium. At most 4 breakpoints; we use up to 3.
MIN_CACHEABLE_CHARS = 4 * 1024  # ~1,024 tokens at ~4 characters a token


def add_cache_breakpoints(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (an Anthropic body) with ``cache_control`` on the last system block, the
    last tool, and the last block of the turn before the newest user message, wherever the
    prefix up to there is long enough to be cached. Client-set markers are left as they are."""
    if any(isinstance(b, dict) and b.get("cache_control") for b in fmt.cache_blocks(request)):
        return request
    marks: list[dict[str, Any]] = []
    chars = 0
    for tool in request.get("tools") or ():
        chars += len(json.dumps(tool))
    if request.get("tools") and chars >= MIN_CACHEABLE_CHARS:
        marks.append(request["tools"][-1])
    for block in request.get("system") or ():
        chars += len(block.get("text", ""))
    if request.get("system") and chars >= MIN_CACHEABLE_CHARS:
        marks.append(request["system"][-1])
    messages = request.get("messages") or []
    for msg in messages[:-1]:
        chars += len(json.dumps(msg.get("content")))
    if len(messages) >= 3 and chars >= MIN_CACHEABLE_CHARS:
        content = messages[-2].get("content")
        if isinstance(content, list) and content:
            marks.append(content[-1])
    for block in marks:
        block["cache_control"] = {"type": "ephemeral"}
    return request


def _reject_unsupported(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise fmt.unsupported("n > 1 (several choices)", "n")
    if body.get("logprobs"):
        raise fmt.unsupported("logprobs", "logprobs")
    if body.get("top_logprobs"):
        raise fmt.unsupported("top_logprobs", "top_logprobs")
    if body.get("logit_bias"):
        raise fmt.unsupported("logit_bias", "logit_bias")
    for legacy in ("functions", "function_call"):
        if body.get(legacy):
            raise fmt.unsupported(f"the legacy '{legacy}' field (use tools)", legacy)
    modalities = body.get("modalities")
    if body.get("audio") or (isinstance(modalities, list) and "audio" in modalities):
        raise fmt.unsupported("audio output", "modalities")


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if fmt.int_or_none(value) is None or value < 1:
            raise BadRequestError(f"'{key}' must be a positive integer", param=key)
        return int(value)
    return DEFAULT_MAX_TOKENS


def _response_format_instruction(response_format: Any) -> str | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "Respond with a single valid JSON object only: no prose, no code fences."
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        text = "Respond with a single valid JSON value only: no prose, no code fences."
        if schema is not None:
            text += " It must conform to this JSON Schema:\n" + json.dumps(schema, sort_keys=True)
        return text
    raise BadRequestError("unsupported response_format type", param="response_format")


def _convert_messages(messages: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list", param="messages")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise BadRequestError("each message must be an object", param=where)
        role = msg.get("role")
        if role in ("system", "developer"):
            system.extend(fmt.system_to_anthropic(msg.get("content"), where))
            continue
        if role == "user":
            anthropic_role, blocks = "user", _user_blocks(msg.get("content"), where)
        elif role == "assistant":
            anthropic_role, blocks = "assistant", _assistant_blocks(msg, where)
        elif role == "tool":
            anthropic_role, blocks = "user", [fmt.tool_message_to_anthropic(msg, where)]
        else:
            raise fmt.unsupported("this message role", f"{where}.role")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == anthropic_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": anthropic_role, "content": blocks})
    if not turns:
        raise BadRequestError("at least one user or assistant message is required", param="messages")
    return system, turns


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for pwhere, part in fmt.chat_parts(content, where):
        kind = part.get("type")
        if kind == "text":
            blocks.append(fmt.text_to_anthropic(part, pwhere))
        elif kind == "image_url":
            blocks.append(fmt.image_to_anthropic(part, pwhere))
        else:
            raise fmt.unsupported("this content part type", f"{pwhere}.type")
    return blocks


def _assistant_blocks(msg: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = msg.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    elif content is not None:
        for pwhere, part in fmt.chat_parts(content, where):
            if part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                blocks.append({"type": "text", "text": part["refusal"]})
            elif part.get("type") == "text":
                blocks.append(fmt.text_to_anthropic(part, pwhere))
            else:
                raise fmt.unsupported("this assistant content part type", f"{pwhere}.type")
        blocks = [b for b in blocks if b["text"]]
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, list):
        raise BadRequestError("'tool_calls' must be a list", param=f"{where}.tool_calls")
    for k, call in enumerate(calls):
        blocks.append(fmt.tool_call_to_anthropic(call, f"{where}.tool_calls[{k}]"))
    return blocks


# ---------------------------------------------------------------- response: Anthropic -> OpenAI


def from_anthropic_response(msg: Any, model: str, *, created: int | None = None) -> ChatResult:
    """An Anthropic message -> an OpenAI ``chat.completion`` body with normalised usage.
    Raises ``MalformedResponseError`` when the body is not an Anthropic message."""
    if (
        not isinstance(msg, dict)
        or not isinstance(msg.get("id"), str)
        or not isinstance(msg.get("content"), list)
    ):
        raise MalformedResponseError("not an Anthropic message object")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in msg["content"]:
        if not isinstance(block, dict):
            raise MalformedResponseError("content block is not an object")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                fmt.tool_call(block.get("id"), block.get("name"), json.dumps(block.get("input", {})))
            )
    message = fmt.assistant_message(texts, calls)
    message["refusal"] = None
    usage = fmt.usage_from_anthropic(msg.get("usage")) or Usage()
    body = {
        "id": msg["id"],
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": fmt.finish_reason(msg.get("stop_reason")),
            }
        ],
        "usage": usage.to_openai(),
    }
    return ChatResult(body=body, usage=usage)
