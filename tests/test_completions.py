"""Legacy ``/v1/completions`` over chat routes, through the official ``openai`` SDK: the prompt
goes up as one user message, the answer (or every chunk of the stream) comes back in the
``text_completion`` shape, validated against the SDK's own ``Completion`` type; what a chat
upstream cannot do is a 400 naming the field, with the upstream untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from openai.types import Completion

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, start_gateway

REPLY = "echo: hello pad pad pad pad pad pad"  # the mock's echo rule, 8 words
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key(), max_retries=0, timeout=30) as c:
        yield c


def chat_sent(mock: MockUpstream) -> list[dict[str, Any]]:
    return [r["body"] for r in mock.requests() if r["path"] == "/v1/chat/completions"]


def strict(obj: dict[str, Any]) -> Completion:
    """Validate against the SDK's type (pydantic, not the SDK's lenient construct)."""
    return Completion.model_validate(obj, strict=False)


def sse_objects(text: str) -> list[dict[str, Any]]:
    out = []
    for frame in text.split("\n\n"):
        if frame.startswith("data: ") and frame != "data: [DONE]":
            out.append(json.loads(frame[6:]))
    return out


def test_completion_over_a_chat_route(
    client: openai.OpenAI, gateway: RunningGateway, mock: MockUpstream
) -> None:
    raw = client.completions.with_raw_response.create(
        model="auto", prompt="hello", max_tokens=20, temperature=0
    )
    resp = raw.parse()
    assert isinstance(resp, Completion) and resp.object == "text_completion"
    strict(json.loads(raw.text))
    assert resp.id.startswith("cmpl-")
    assert [c.text for c in resp.choices] == [REPLY] and resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None and resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens > 0
    assert raw.headers["x-switchyard-model"] == "small" and raw.headers["x-switchyard-provider"] == "mock"
    (sent,) = chat_sent(mock)
    assert sent["messages"] == [{"role": "user", "content": "hello"}]
    assert sent["max_completion_tokens"] == 20 and "prompt" not in sent and "max_tokens" not in sent
    (row,) = gateway.ledger_rows()
    assert row["endpoint"] == "completions" and row["served_model"] == "small" and row["status"] == "ok"
    assert row["output_tokens"] == 8 and row["input_tokens"] == resp.usage.prompt_tokens
    assert float(row["cost_usd"]) > 0


def test_streamed_completion_with_usage(
    client: openai.OpenAI, gateway: RunningGateway, mock: MockUpstream
) -> None:
    with httpx.Client(timeout=30) as http:
        r = http.post(
            gateway.base_url + "/completions",
            headers=gateway.headers(),
            json={
                "model": "auto",
                "prompt": "hello",
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    chunks = sse_objects(r.text)
    for chunk in chunks:  # OpenAI sends finish_reason null until the last choice chunk
        assert all(c["finish_reason"] in (None, "stop", "length") for c in chunk["choices"])
        filled = [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]
        strict({**chunk, "choices": filled})
    text = "".join(c["text"] for ch in chunks for c in ch["choices"])
    assert text == REPLY
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert [c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]] == ["stop"]
    # the SDK's own stream reader over the same endpoint
    stream = client.completions.create(model="auto", prompt="hello", stream=True)
    parts = list(stream)
    assert all(isinstance(p, Completion) for p in parts)
    assert "".join(c.text for p in parts for c in p.choices) == REPLY
    rows = gateway.ledger_rows()
    assert [(r["endpoint"], r["stream"], r["status"]) for r in rows] == [("completions", 1, "ok")] * 2
    assert rows[0]["output_tokens"] == 8


def test_n_stop_and_max_tokens(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.completions.create(model="auto", prompt="hello", n=2, max_tokens=3)
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.finish_reason == "length" and len(c.text.split()) == 3 for c in resp.choices)
    resp = client.completions.create(model="auto", prompt="hello", stop=["pad"])
    assert resp.choices[0].text.strip() == "echo: hello"
    sent = chat_sent(mock)
    assert sent[0]["n"] == 2 and sent[0]["max_completion_tokens"] == 3 and sent[1]["stop"] == ["pad"]
    stream = client.completions.create(model="auto", prompt="hello", n=2, stream=True)
    texts: dict[int, str] = {0: "", 1: ""}
    for part in stream:
        for c in part.choices:
            texts[c.index] += c.text
    assert texts == {0: REPLY, 1: REPLY}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": [[1, 2]]}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_untranslatable_fields_are_refused_by_name(
    gateway: RunningGateway, mock: MockUpstream, extra: dict[str, Any], param: str
) -> None:
    r = gateway.post("/v1/completions", {"model": "auto", "prompt": "hello", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"] and err["type"] == "invalid_request_error"
    assert err["code"] == (
        None if param == "stream" else "unsupported_parameter"
    )  # stream: a wire type error
    assert mock.requests() == []


def test_sdk_raises_bad_request_for_echo(client: openai.OpenAI, mock: MockUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="auto", prompt="hello", echo=True)
    assert info.value.param == "echo"
    assert mock.requests() == []


def test_best_of_one_and_echo_false_are_fine(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.completions.create(model="auto", prompt=["hello"], best_of=1, echo=False)
    assert resp.choices[0].text == REPLY
    (sent,) = chat_sent(mock)
    assert not {"best_of", "echo", "logprobs", "suffix"} & set(sent)


def test_a_completions_model_still_passes_through(client: openai.OpenAI, mock: MockUpstream) -> None:
    resp = client.completions.create(model="legacy", prompt="hi")
    assert resp.choices[0].text == "echo: hi pad pad pad pad pad pad"
    assert [r["path"] for r in mock.requests()] == ["/v1/completions"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="legacy", prompt="hi", stream=True)
    assert info.value.param == "stream"


def test_cache_hit_replays_as_a_completion(
    client: openai.OpenAI, gateway: RunningGateway, mock: MockUpstream
) -> None:
    first = client.completions.with_raw_response.create(model="auto", prompt="hello", temperature=0)
    again = client.completions.with_raw_response.create(model="auto", prompt="hello", temperature=0)
    assert first.headers["x-switchyard-cache"] == "miss" and again.headers["x-switchyard-cache"] == "hit"
    assert again.parse().choices[0].text == REPLY
    strict(json.loads(again.text))
    assert again.headers["x-switchyard-model"] == "small" and again.headers["x-switchyard-provider"] == "mock"
    streamed = client.completions.create(model="auto", prompt="hello", temperature=0, stream=True)
    assert "".join(c.text for p in streamed for c in p.choices) == REPLY
    assert len(chat_sent(mock)) == 1
    statuses = [(r["endpoint"], r["cache_status"]) for r in gateway.ledger_rows()]
    assert statuses == [("completions", "miss"), ("completions", "hit"), ("completions", "hit")]


def test_default_policy_serves_completions(
    tmp_path: Path, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of the box: the shipped default policy, an OpenAI key and base URL, no edits."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-default-policy-0123456789")
    monkeypatch.setenv("OPENAI_BASE_URL", mock.base_url + "/v1")
    gw = start_gateway(tmp_path, (ROOT / "policies" / "default.yaml").read_text())
    try:
        with openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0, timeout=30) as client:
            for model in ("chat-cheap", "gpt-5-mini"):
                resp = client.completions.create(model=model, prompt="hello")
                assert resp.choices[0].text == REPLY
            parts = list(client.completions.create(model="chat-cheap", prompt="hello", stream=True))
            assert "".join(c.text for p in parts for c in p.choices) == REPLY
        assert [r["endpoint"] for r in gw.ledger_rows()] == ["completions"] * 3
    finally:
        gw.stop()
