"""Units of the Responses surface without a server: the translator (Responses -> chat and back,
stream events validated against the openai SDK's models) and the SQLite response store (per
tenant, TTL)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.core.errors import BadRequestError, StreamBrokenError
from gateway.core.types import Usage
from gateway.ledger.responses import SqliteResponseStore
from gateway.protocols.openai_responses import from_chat, input_items, skeleton, to_chat
from gateway.protocols.openai_responses_events import EventEncoder

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def chat_of(body: dict[str, Any]) -> dict[str, Any]:
    chat, _ = to_chat(body, input_items(body))
    return chat


def test_items_translate_to_chat_messages() -> None:
    body = {
        "model": "m",
        "instructions": "sys",
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "thinking"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"},
        "stream": True,
    }
    chat = chat_of(body)
    msgs = chat["messages"]
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert msgs[1] == {"role": "user", "content": "q"}
    assert msgs[2]["role"] == "assistant" and msgs[2]["content"] == "thinking"
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["c1", "c2"]  # one assistant turn
    assert msgs[3:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_reasoning_items_are_dropped_and_named() -> None:
    body = {"model": "m", "input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "q"}]}
    chat, dropped = to_chat(body, input_items(body))
    assert dropped == ["reasoning"] and chat["messages"] == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"input": [{"type": "computer_call_output"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": []}, "input"),
    ],
)
def test_untranslatable_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequestError) as err:
        chat_of({"model": "m", **body})
    assert err.value.param == param


def test_completion_becomes_a_valid_response() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": "partial",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            }
        ]
    }
    usage = Usage(10, 5, cached_input_tokens=4, reasoning_tokens=2)
    body = {"model": "m", "input": "q", "max_output_tokens": 5, "text": {"format": {"type": "json_object"}}}
    resp = Response.model_validate(from_chat(body, completion, "resp_1", 1, usage))
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in resp.output] == ["message", "function_call"] and resp.output_text == "partial"
    assert resp.usage is not None and resp.usage.input_tokens_details.cached_tokens == 4
    assert resp.usage.output_tokens_details.reasoning_tokens == 2 and resp.usage.total_tokens == 15


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_encoder_events_validate_text_then_tools() -> None:
    enc = EventEncoder(skeleton({"model": "m"}, "resp_1", 1))
    events = list(enc.start())
    events += enc.add(_chunk({"role": "assistant", "content": ""}))
    events += enc.add(_chunk({"content": "Hel"}))
    events += enc.add(_chunk({"content": "lo"}))
    tc = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    events += enc.add(_chunk({"tool_calls": [tc]}))
    events += enc.add(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}))
    events += enc.add(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "tool_calls"))
    events += enc.finish(Usage(3, 4))
    for e in events:
        EVENTS.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "completed" and final.output_text == "Hello"
    call = final.output[1]
    assert call.type == "function_call" and call.arguments == '{"a":1}' and call.call_id == "call_1"
    error = enc.error(StreamBrokenError("cut"))
    assert EVENTS.validate_python(error).type == "error"


async def _exercise_store(store: Any, expired: Any) -> None:
    await store.put("a", {"id": "resp_1", "created_at": 1, "output": [{"o": 1}]}, [{"i": 1}], None)
    await store.put("a", {"id": "resp_1", "created_at": 1, "output": [{"o": 1}]}, [{"i": 1}], None)  # upsert
    await store.put("a", {"id": "resp_2", "output": [{"o": 2}]}, [{"i": 2}], "resp_1")
    await store.put("a", {"id": "resp_3", "output": [{"o": 3}]}, [{"i": 3}], "resp_2")
    got = await store.get("a", "resp_2")
    assert got is not None and got.input_items == [{"i": 2}] and got.response["output"] == [{"o": 2}]
    assert await store.conversation("a", "resp_3") == [
        {"i": 1},
        {"o": 1},
        {"i": 2},
        {"o": 2},
        {"i": 3},
        {"o": 3},
    ]
    assert await store.get("b", "resp_1") is None and await store.conversation("b", "resp_3") is None
    assert await store.delete("b", "resp_1") is False
    await expired.put("a", {"id": "resp_x", "output": []}, [], None)
    assert await expired.get("a", "resp_x") is None
    assert await store.delete("a", "resp_2") is True
    assert await store.get("a", "resp_2") is None
    assert await store.get("a", "resp_3") is not None  # still readable...
    assert await store.conversation("a", "resp_3") is None  # ...but its chain is broken
    assert await store.conversation("a", "resp_1") == [{"i": 1}, {"o": 1}]
    store.close()
    expired.close()


def test_store_is_per_tenant_chains_and_expires(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    asyncio.run(_exercise_store(SqliteResponseStore(path), SqliteResponseStore(path, ttl_s=-1)))


def test_namespace_tools_are_flattened_and_calls_name_their_namespace() -> None:
    fn = {"type": "function", "name": "spawn", "parameters": {"type": "object"}}
    tools = [{"type": "namespace", "name": "agents_v1", "description": "d", "tools": [fn]}]
    body = {"model": "m", "input": "q", "tools": tools}
    assert chat_of(body)["tools"] == [
        {"type": "function", "function": {"name": "spawn", "parameters": {"type": "object"}}}
    ]
    call = {"id": "c", "type": "function", "function": {"name": "spawn", "arguments": "{}"}}
    completion = {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [call]}}]}
    resp = Response.model_validate(from_chat(body, completion, "resp_1", 1, Usage(1, 1)))
    assert resp.output[0].type == "function_call" and resp.output[0].namespace == "agents_v1"
    with pytest.raises(BadRequestError) as err:
        chat_of({**body, "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]})
    assert err.value.param == "tools[0].tools[0].type"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from(
        [
            "",
            "x",
            "function",
            "message",
            "user",
            "assistant",
            "input_text",
            "input_image",
            "function_call",
            "function_call_output",
            "namespace",
            "json_schema",
            "developer",
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "role",
                    "content",
                    "text",
                    "name",
                    "call_id",
                    "arguments",
                    "output",
                    "tools",
                    "image_url",
                    "schema",
                    "format",
                    "id",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(input_=JSON, tools=st.lists(JSON, max_size=2) | st.none(), choice=JSON, text=JSON)
def test_any_json_is_translated_or_refused_with_a_400(
    input_: Any, tools: Any, choice: Any, text: Any
) -> None:
    body = {
        "model": "m",
        "input": input_ if isinstance(input_, (str, list)) else "x",
        "tools": tools,
        "tool_choice": choice,
    }
    if isinstance(body["input"], list):
        body["input"] = [i for i in body["input"] if isinstance(i, dict)]  # the wire model's list[dict]
    if isinstance(text, dict):
        body["text"] = text
    if not isinstance(choice, (str, dict)):
        body["tool_choice"] = None
    if isinstance(tools, list):
        body["tools"] = [t for t in tools if isinstance(t, dict)]
    try:
        chat, _ = to_chat(body, input_items(body))
    except BadRequestError as exc:
        assert exc.param
        return
    assert chat["messages"]


def test_postgres_store_is_per_tenant_chains_and_expires() -> None:
    from gateway.ledger.responses import PgResponseStore, open_response_store
    from tests.pg_support import scratch_schema

    with scratch_schema("responses") as url:
        assert isinstance(open_response_store(url, Path("/nonexistent")), PgResponseStore)
        asyncio.run(_exercise_store(PgResponseStore(url), PgResponseStore(url, ttl_s=-1)))


def test_upstream_reasoning_becomes_a_reasoning_item() -> None:
    completion = {
        "choices": [{"finish_reason": "stop", "message": {"reasoning_content": "think", "content": "ok"}}]
    }
    resp = Response.model_validate(
        from_chat({"model": "m"}, completion, "resp_1", 1, Usage(1, 2, reasoning_tokens=1))
    )
    assert [o.type for o in resp.output] == ["reasoning", "message"] and resp.output_text == "ok"
    assert resp.output[0].content[0].text == "think"  # type: ignore[union-attr,index]
    enc = EventEncoder(skeleton({"model": "m"}, "resp_2", 1))
    events = list(enc.start())
    events += enc.add(_chunk({"reasoning": "th"}))
    events += enc.add(_chunk({"reasoning": "ink"}))
    events += enc.add(_chunk({"content": "ok"}, "stop"))
    events += enc.finish(Usage(1, 2))
    for e in events:
        EVENTS.validate_python(e)
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.content_part.added")
    final = Response.model_validate(events[-1]["response"])
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == "think"  # type: ignore[union-attr,index]


def test_json_object_format_and_text_format() -> None:
    assert chat_of({"model": "m", "input": "q", "text": {"format": {"type": "json_object"}}})[
        "response_format"
    ] == {"type": "json_object"}
    assert "response_format" not in chat_of(
        {"model": "m", "input": "q", "text": {"format": {"type": "text"}}}
    )


def test_refusal_deltas_become_a_refusal_part() -> None:
    enc = EventEncoder(skeleton({"model": "m"}, "resp_3", 1))
    events = list(enc.start())
    events += enc.add(_chunk({"content": "I "}))
    events += enc.add(_chunk({"refusal": "can't "}))
    events += enc.add(_chunk({"refusal": "help"}, "stop"))
    events += enc.finish(Usage(1, 3))
    for e in events:
        EVENTS.validate_python(e)
    added = [e for e in events if e["type"] == "response.content_part.added"]
    assert [(e["content_index"], e["part"]) for e in added] == [
        (0, {"type": "output_text", "text": "", "annotations": []}),
        (1, {"type": "refusal", "refusal": ""}),  # snapshots, not the parts as they grew
    ]
    done = next(e for e in events if e["type"] == "response.refusal.done")
    assert done["refusal"] == "can't help" and done["content_index"] == 1
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "I " and final.output[0].content[1].type == "refusal"  # type: ignore[union-attr]


def test_concurrent_puts_share_commits_and_each_returns_once_stored(tmp_path: Path) -> None:
    """Group commit: 64 responses stored at once take far fewer transactions than 64, and each
    put returns only when its row can be read back (a previous_response_id sent right after
    the answer finds it)."""
    store = SqliteResponseStore(tmp_path / "responses.db")

    async def put_then_get(i: int) -> None:
        await store.put("t", {"id": f"resp_{i}", "created_at": 1.0, "output": []}, [], None)
        assert await store.get("t", f"resp_{i}") is not None

    async def go() -> None:
        await asyncio.gather(*(put_then_get(i) for i in range(64)))

    asyncio.run(go())
    assert 1 <= store.commits <= 32, store.commits
    store.close()


def test_a_failed_group_fails_its_puts_and_the_next_put_still_runs(tmp_path: Path) -> None:
    store = SqliteResponseStore(tmp_path / "responses.db")
    store.close()  # every write now fails

    async def go() -> None:
        for _ in range(2):  # the second put is not left waiting behind the failed group
            with pytest.raises(sqlite3.ProgrammingError):
                await asyncio.wait_for(store.put("t", {"id": "resp_x", "output": []}, [], None), 10)

    asyncio.run(go())


def test_a_cancelled_put_is_stored_all_the_same(tmp_path: Path) -> None:
    store = SqliteResponseStore(tmp_path / "responses.db")

    async def go() -> None:
        task = asyncio.ensure_future(store.put("t", {"id": "resp_c", "output": []}, [], None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.put("t", {"id": "resp_d", "output": []}, [], None)  # after the cancelled one's group
        assert await store.get("t", "resp_c") is not None

    asyncio.run(go())
    store.close()
