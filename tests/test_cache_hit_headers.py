"""A cache hit says which model and provider produced the answer it replays, as every response
does (``x-switchyard-model`` / ``x-switchyard-provider``): exact and semantic hits, JSON and
streamed, on the chat, completions, Messages and Responses surfaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, start_gateway
from tests.test_semantic_gateway import policy_with_faq

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, policy_with_faq(mock.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


def served(r: Any) -> tuple[str, str, str]:
    assert r.status_code == 200, r.text
    h = r.headers
    return h["x-switchyard-cache"], h.get("x-switchyard-model", "-"), h.get("x-switchyard-provider", "-")


@pytest.mark.parametrize(
    ("path", "body", "stream_body"),
    [
        ("/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0}, {"stream": True}),
        ("/v1/completions", {"model": "auto", "prompt": "hello", "temperature": 0}, {"stream": True}),
        (
            "/v1/responses",
            {"model": "auto", "input": "hello", "temperature": 0, "store": False},
            {"stream": True},
        ),
        (
            "/v1/messages",
            {"model": "auto", "max_tokens": 50, "messages": HELLO, "temperature": 0},
            {"stream": True},
        ),
        (
            "/v1/messages",
            {"model": "claude", "max_tokens": 50, "messages": HELLO, "temperature": 0},
            {"stream": True},
        ),
    ],
)
def test_exact_hits_name_the_model_and_provider(
    gateway: RunningGateway, mock: MockUpstream, path: str, body: dict[str, Any], stream_body: dict[str, Any]
) -> None:
    gw = gateway
    first = served(gw.post(path, body))
    assert first[0] == "miss" and first[1] != "-"
    assert served(gw.post(path, body)) == ("hit", first[1], first[2])
    assert served(gw.post(path, {**body, **stream_body})) == ("hit", first[1], first[2])
    assert len(mock.requests()) == 1


def test_semantic_hits_name_the_model_and_provider(gw: RunningGateway, mock: MockUpstream) -> None:
    def ask(text: str, **kw: Any) -> Any:
        body = {"model": "faq", "messages": [{"role": "user", "content": text}], "temperature": 0, **kw}
        return gw.post("/v1/chat/completions", body, timeout=120)  # the first one loads the embedder

    assert served(ask("How can I reset my password?")) == ("miss", "small", "mock")
    assert served(ask("How do I reset my password?")) == ("semantic", "small", "mock")
    assert served(ask("how do i reset my password", stream=True)) == ("semantic", "small", "mock")
    body = {"model": "faq", "input": "How do I reset my password?", "store": False, "temperature": 0}
    r = gw.post("/v1/responses", body)
    assert served(r) == ("semantic", "small", "mock")
    assert len(mock.requests()) == 1


def test_anthropic_sdk_sees_the_headers_on_a_hit(gateway: RunningGateway, mock: MockUpstream) -> None:
    gw = gateway
    with anthropic.Anthropic(base_url=gw.url, api_key=gw.key(), max_retries=0) as client:
        kw: Any = {"model": "claude", "max_tokens": 50, "messages": HELLO, "extra_body": {"temperature": 0}}
        miss = client.messages.with_raw_response.create(**kw)
        hit = client.messages.with_raw_response.create(**kw)
    assert miss.headers["x-switchyard-cache"] == "miss" and hit.headers["x-switchyard-cache"] == "hit"
    assert hit.headers["x-switchyard-model"] == "claude"
    assert hit.headers["x-switchyard-provider"] == "mock-anthropic"
    assert hit.parse().content[0].text == miss.parse().content[0].text  # type: ignore[union-attr]
    ledger = gw.ledger_rows()
    assert [(r["cache_status"], r["served_model"]) for r in ledger] == [("miss", "claude"), ("hit", None)]
