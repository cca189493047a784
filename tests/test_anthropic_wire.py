"""Golden tests for the OpenAI <-> Anthropic translation (written out by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.errors import BadRequestError, StreamBrokenError
from gateway.core.types import Usage
from gateway.protocols.anthropic_events import StreamTranslator
from gateway.protocols.anthropic_format import usage_from_anthropic
from gateway.protocols.anthropic_outbound import (
    DEFAULT_MAX_TOKENS,
    MalformedResponseError,
    from_anthropic_response,
    to_anthropic_request,
)

MODEL = "claude-test-1"


def req(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return to_anthropic_request({"model": "auto", "messages": messages, **extra}, MODEL)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


# ------------------------------------------------------------------------------ requests


def test_minimal_request_defaults() -> None:
    assert req([{"role": "user", "content": "hi"}]) == {
        "model": MODEL,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [user("hi")],
    }


def test_system_and_developer_messages_become_system_blocks_with_cache_control() -> None:
    out = req(
        [
            {"role": "system", "content": "You are terse."},
            {
                "role": "developer",
                "content": [
                    {"type": "text", "text": "Big shared prefix", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "Second part"},
                ],
            },
            {"role": "user", "content": "hi"},
            {"role": "system", "content": ""},
        ]
    )
    assert out["system"] == [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Big shared prefix", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Second part"},
    ]
    assert out["messages"] == [user("hi")]


def test_multi_turn_merges_consecutive_same_role_messages() -> None:
    out = req(
        [
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"},
        ]
    )
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
        user("e"),
    ]


def test_images_data_url_and_http_url() -> None:
    out = req(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
                    },
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            }
        ]
    )
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            ],
        }
    ]


@pytest.mark.parametrize("url", ["data:image/png,rawbytes", "ftp://example.com/a.png"])
def test_unsupported_image_urls_are_rejected(url: str) -> None:
    with pytest.raises(BadRequestError) as info:
        req([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    assert info.value.param == "messages[0].content[0].image_url.url"


def test_unsupported_content_part_is_rejected() -> None:
    with pytest.raises(BadRequestError) as info:
        req(
            [
                {
                    "role": "user",
                    "content": [{"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}],
                }
            ]
        )
    assert info.value.param == "messages[0].content[0].type"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tools_tool_calls_and_tool_results() -> None:
    out = req(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "24C"}]},
            {"role": "user", "content": "Thanks. Which is warmer?"},
        ],
        tools=[WEATHER_TOOL, {"type": "function", "function": {"name": "now"}}],
    )
    assert out["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
        {"name": "now", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert "tool_choice" not in out
    assert out["messages"] == [
        user("Weather in Paris and Rome?"),
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": [{"type": "text", "text": "24C"}],
                },
                {"type": "text", "text": "Thanks. Which is warmer?"},
            ],
        },
    ]


def test_assistant_text_with_tool_call_keeps_both() -> None:
    out = req(
        [
            {"role": "user", "content": "time?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "now", "arguments": ""}}
                ],
            },
        ]
    )
    assert out["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "t1", "name": "now", "input": {}},
        ],
    }


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1, 2]"])
def test_invalid_tool_call_arguments_name_the_param(arguments: str) -> None:
    secret_prompt = "my secret prompt"
    with pytest.raises(BadRequestError) as info:
        req(
            [
                {"role": "user", "content": secret_prompt},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
                    ],
                },
            ]
        )
    assert info.value.param == "messages[1].tool_calls[0].function.arguments"
    assert secret_prompt not in info.value.message and arguments not in info.value.message


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            None,
            {"type": "tool", "name": "get_weather"},
        ),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        ("none", False, {"type": "none"}),
        ("auto", True, {"type": "auto"}),
    ],
)
def test_tool_choice_variants(choice: Any, parallel: Any, expected: dict[str, Any]) -> None:
    extra: dict[str, Any] = {"tools": [WEATHER_TOOL]}
    if choice is not None:
        extra["tool_choice"] = choice
    if parallel is not None:
        extra["parallel_tool_calls"] = parallel
    assert req([{"role": "user", "content": "x"}], **extra)["tool_choice"] == expected


def test_tool_choice_without_tools_is_dropped() -> None:
    out = req([{"role": "user", "content": "x"}], tool_choice="none", parallel_tool_calls=False)
    assert "tool_choice" not in out and "tools" not in out


def test_sampling_params_and_dropped_openai_only_fields() -> None:
    out = req(
        [{"role": "user", "content": "x"}],
        max_tokens=100,
        temperature=1.7,
        top_p=0.9,
        stop="END",
        user="user-42",
        stream=True,
        stream_options={"include_usage": True},
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        response_format={"type": "text"},
        store=False,
        metadata={"k": "v"},
        n=1,
        logprobs=False,
    )
    assert out == {
        "model": MODEL,
        "max_tokens": 100,
        "messages": [user("x")],
        "temperature": 1.0,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "user-42"},
        "stream": True,
    }


def test_top_p_is_kept_only_without_temperature() -> None:
    assert req([{"role": "user", "content": "x"}], top_p=0.5)["top_p"] == 0.5
    assert "top_p" not in req([{"role": "user", "content": "x"}], top_p=0.5, temperature=0)


def test_max_completion_tokens_wins_and_stop_list_and_low_temperature() -> None:
    out = req(
        [{"role": "user", "content": "x"}],
        max_tokens=10,
        max_completion_tokens=20,
        stop=["a", "b"],
        temperature=0.3,
    )
    assert (out["max_tokens"], out["stop_sequences"], out["temperature"]) == (20, ["a", "b"], 0.3)


def test_stream_argument_overrides_body() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    assert "stream" not in to_anthropic_request(body, MODEL, stream=False)
    assert to_anthropic_request({**body, "stream": False}, MODEL, stream=True)["stream"] is True


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tool_choice": "sometimes", "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
def test_unsupported_fields_are_rejected_with_param(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        req([{"role": "user", "content": "x"}], **extra)
    assert info.value.param == param
    assert info.value.status == 400


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(BadRequestError) as info:
        req([{"role": "function", "name": "f", "content": "x"}])
    assert info.value.param == "messages[0].role"


def test_response_format_json_becomes_system_instruction() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = req(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": schema, "strict": True},
        },
    )
    assert out["system"] == [
        {"type": "text", "text": "S"},
        {
            "type": "text",
            "text": "Respond with a single valid JSON value only: no prose, no code fences. "
            "It must conform to this JSON Schema:\n"
            '{"properties": {"a": {"type": "integer"}}, "type": "object"}',
        },
    ]
    out = req([{"role": "user", "content": "x"}], response_format={"type": "json_object"})
    assert out["system"] == [
        {"type": "text", "text": "Respond with a single valid JSON object only: no prose, no code fences."}
    ]


# ------------------------------------------------------------------------------ responses


def anthropic_message(content: list[dict[str, Any]], stop_reason: str, **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-upstream",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
    }


def test_text_response_with_cache_usage() -> None:
    msg = anthropic_message(
        [{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}],
        "end_turn",
        cache_read_input_tokens=100,
        cache_creation_input_tokens=20,
    )
    result = from_anthropic_response(msg, "served-model", created=1700000000)
    assert result.usage == Usage(
        input_tokens=130, output_tokens=5, cached_input_tokens=100, cache_write_tokens=20
    )
    assert result.body == {
        "id": "msg_01",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "served-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello world", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 130,
            "completion_tokens": 5,
            "total_tokens": 135,
            "prompt_tokens_details": {"cached_tokens": 100},
        },
    }


def test_tool_use_response() -> None:
    msg = anthropic_message(
        [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
        "tool_use",
    )
    choice = from_anthropic_response(msg, "m", created=1).body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
        "refusal": None,
    }


def test_tool_only_response_has_null_content() -> None:
    msg = anthropic_message([{"type": "tool_use", "id": "t", "name": "now", "input": {}}], "tool_use")
    assert from_anthropic_response(msg, "m").body["choices"][0]["message"]["content"] is None


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
    ],
)
def test_stop_reason_mapping(stop_reason: str, finish: str) -> None:
    msg = anthropic_message([{"type": "text", "text": "x"}], stop_reason)
    assert from_anthropic_response(msg, "m").body["choices"][0]["finish_reason"] == finish


def test_usage_without_cache_fields_and_missing_usage() -> None:
    assert usage_from_anthropic({"input_tokens": 3, "output_tokens": 4}) == Usage(
        input_tokens=3, output_tokens=4
    )
    assert usage_from_anthropic(None) is None
    msg = anthropic_message([], "end_turn")
    del msg["usage"]
    assert from_anthropic_response(msg, "m").usage == Usage()


@pytest.mark.parametrize("bad", [None, [], {"id": "x"}, {"id": "x", "content": ["text"]}])
def test_malformed_response(bad: Any) -> None:
    with pytest.raises(MalformedResponseError):
        from_anthropic_response(bad, "m")


# ------------------------------------------------------------------------------ streams

TEXT_STREAM: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_s1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-upstream",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 25,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 1000,
                    "output_tokens": 1,
                },
            },
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    ("ping", {"type": "ping"}),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 7},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "msg_s1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "served",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_s1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "served",
        "choices": [],
        "usage": usage,
    }


def run_stream(events: list[tuple[str, dict[str, Any]]]) -> tuple[StreamTranslator, list[dict[str, Any]]]:
    tr = StreamTranslator("served", created=1700000000)
    out: list[dict[str, Any]] = []
    for name, data in events:
        out.extend(tr.feed(name, data))
    return tr, out


def test_text_stream_golden() -> None:
    tr, chunks = run_stream(TEXT_STREAM)
    assert chunks == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        chunk({"content": " there"}),
        chunk({}, "stop"),
        usage_chunk(
            {
                "prompt_tokens": 1025,
                "completion_tokens": 7,
                "total_tokens": 1032,
                "prompt_tokens_details": {"cached_tokens": 1000},
            }
        ),
    ]
    assert tr.finished
    assert tr.usage == Usage(
        input_tokens=1025, output_tokens=7, cached_input_tokens=1000, cache_write_tokens=0
    )


TOOL_STREAM: list[tuple[str, dict[str, Any]]] = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_s1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-upstream",
                "usage": {"input_tokens": 400, "output_tokens": 2},
            },
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Ok."}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
        },
    ),
    (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_10", "name": "now", "input": {}},
        },
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 2}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 40},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


def test_tool_call_stream_golden() -> None:
    tr, chunks = run_stream(TOOL_STREAM)
    assert chunks == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Ok."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "toolu_9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "toolu_10",
                        "type": "function",
                        "function": {"name": "now", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        usage_chunk({"prompt_tokens": 400, "completion_tokens": 40, "total_tokens": 440}),
    ]
    assert tr.usage == Usage(input_tokens=400, output_tokens=40)


def test_message_delta_cumulative_usage_overrides_start() -> None:
    events = [
        TEXT_STREAM[0],
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens"},
                "usage": {"input_tokens": 30, "cache_read_input_tokens": 1000, "output_tokens": 9},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    tr, chunks = run_stream(events)
    assert chunks[1] == chunk({}, "length")
    assert tr.usage == Usage(
        input_tokens=1030, output_tokens=9, cached_input_tokens=1000, cache_write_tokens=0
    )


def test_events_after_message_stop_are_ignored_and_event_name_fallback() -> None:
    tr = StreamTranslator("served", created=1700000000)
    # data without "type": the SSE event name decides
    assert tr.feed("message_start", {"message": {"id": "msg_s1", "usage": {"input_tokens": 1}}}) == [
        chunk({"role": "assistant", "content": ""})
    ]
    out = tr.feed("message_stop", {})
    assert out[0] == chunk({}, "stop")  # no message_delta seen: a finish chunk is still sent
    assert tr.finished
    assert tr.feed("content_block_delta", TEXT_STREAM[3][1]) == []


def test_unknown_events_and_thinking_deltas_are_ignored() -> None:
    tr, chunks = run_stream(
        [
            TEXT_STREAM[0],
            ("future_event", {"type": "future_event", "x": 1}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "hmm"},
                },
            ),
        ]
    )
    assert chunks == [chunk({"role": "assistant", "content": ""})]
    assert not tr.finished


@pytest.mark.parametrize(
    ("etype", "retryable"),
    [("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)],
)
def test_error_event_raises_stream_broken(etype: str, retryable: bool) -> None:
    tr = StreamTranslator("served")
    tr.feed(*TEXT_STREAM[0])
    with pytest.raises(StreamBrokenError) as info:
        tr.feed("error", {"type": "error", "error": {"type": etype, "message": "Overloaded"}})
    assert info.value.retryable is retryable
    assert etype in info.value.message
    assert not tr.finished


def test_error_event_before_message_start() -> None:
    with pytest.raises(StreamBrokenError) as info:
        StreamTranslator("served").feed("error", {"type": "error", "error": {"type": "overloaded_error"}})
    assert info.value.retryable


def test_content_before_message_start_is_broken() -> None:
    with pytest.raises(StreamBrokenError):
        StreamTranslator("served").feed(*TEXT_STREAM[3])
