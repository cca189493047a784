"""OpenAI legacy completions (``POST /v1/completions``) over a chat route: the wire model, the
request translated to one user message, and the chat answer (or its chunks) translated back to
the ``text_completion`` shape.

What a chat upstream cannot do is refused with a 400 naming the field, never dropped
silently: ``echo``, ``logprobs``, ``suffix``, ``best_of`` > 1, token-id prompts and a batch of
more than one prompt. Unknown fields pass through to the chat body, like on chat."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from gateway.core.errors import BadRequestError
from gateway.protocols.openai_chat import Number, StreamOptions, _Open

# Parameters that mean the same on both endpoints, copied as they are.
_SHARED = (
    "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "user", "stream", "stream_options",
)  # fmt: skip
# Completions-only parameters a chat upstream has no equivalent for.
_REFUSED = ("echo", "logprobs", "suffix", "best_of")
_FINISH = frozenset(("stop", "length", "content_filter"))


class CompletionRequest(_Open):
    model: StrictStr
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    seed: StrictInt | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    echo: StrictBool | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    suffix: StrictStr | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=20)] | None = None


def _refuse(field: str, why: str) -> BadRequestError:
    return BadRequestError(
        f"'{field}' is not supported on /v1/completions through a chat model: {why}",
        param=field,
        code="unsupported_parameter",  # OpenAI's code for a parameter a model does not take
    )


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise _refuse("prompt", "send one prompt per request (a batch of prompts has no chat equivalent)")
    raise _refuse("prompt", "token-id prompts have no chat equivalent; send the prompt as text")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A validated completions body (``validate(CompletionRequest, body)``) as a chat body."""
    if body.get("echo"):
        raise _refuse("echo", "a chat model does not echo the prompt")
    if body.get("logprobs") is not None:
        raise _refuse("logprobs", "token log probabilities are not translated from chat")
    if body.get("suffix"):
        raise _refuse("suffix", "a chat model does not insert text before a suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of > 1:
        raise _refuse("best_of", "a chat model returns every choice it generates; use 'n'")
    if body.get("max_tokens") == 0:
        raise _refuse("max_tokens", "a chat model generates at least one token")
    chat: dict[str, Any] = {
        "model": body["model"],
        "messages": [{"role": "user", "content": _prompt_text(body["prompt"])}],
    }
    if body.get("max_tokens") is not None:
        chat["max_completion_tokens"] = body["max_tokens"]
    skip = {"model", "prompt", "max_tokens", *_REFUSED}
    for key, value in body.items():
        if key not in skip and value is not None:  # _SHARED and unknown fields alike
            chat[key] = value
    return chat


def _id(chat_id: Any) -> str:
    text = str(chat_id or "")
    return "cmpl-" + text.removeprefix("chatcmpl-") if text else "cmpl-switchyard"


def _finish(reason: Any) -> str | None:
    if reason is None:
        return None
    return reason if reason in _FINISH else "stop"  # tool_calls/function_call cannot happen here


def _text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    refusal = message.get("refusal")
    return refusal if isinstance(refusal, str) else ""


def _envelope(chat: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": _id(chat.get("id")),
        "object": "text_completion",
        "created": chat.get("created") or 0,
        "model": chat.get("model") or "",
        "choices": choices,
    }
    if chat.get("system_fingerprint") is not None:
        out["system_fingerprint"] = chat["system_fingerprint"]
    if chat.get("usage") is not None:
        out["usage"] = chat["usage"]
    return out


def from_chat(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as a ``text_completion``."""
    choices = [
        {
            "text": _text(c.get("message")),
            "index": c.get("index", i),
            "logprobs": None,
            "finish_reason": _finish(c.get("finish_reason")) or "stop",
        }
        for i, c in enumerate(chat.get("choices") or [])
    ]
    return _envelope(chat, choices)


def chunk_from_chat(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """A chat stream chunk as a ``text_completion`` stream chunk; None for a chunk that carries
    nothing a completions client sees (the role-only first delta)."""
    choices = []
    for i, c in enumerate(chunk.get("choices") or []):
        text = _text(c.get("delta"))
        finish = _finish(c.get("finish_reason"))
        if text or finish is not None:
            choices.append(
                {"text": text, "index": c.get("index", i), "logprobs": None, "finish_reason": finish}
            )
    if not choices and chunk.get("usage") is None:
        return None
    return _envelope(chunk, choices)
