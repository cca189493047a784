"""The semantic cache end to end: a real gateway, the openai SDK as client, the mock upstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

SEMANTIC_ROUTE = """
  faq:
    targets: [small]
    baseline: large
    semantic_cache: {enabled: true, ttl_s: 600, threshold: 0.9}
"""


def policy_with_faq(mock_url: str) -> str:
    text = mock_policy(mock_url)
    head, tail = text.split("routes:\n", 1)
    return (
        head
        + "routes:\n"
        + SEMANTIC_ROUTE.lstrip("\n")
        + tail.replace("  team-b:\n    models: [auto, small]", "  team-b:\n    models: [auto, small, faq]")
    )


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path, policy_with_faq(mock.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


def client(gw: RunningGateway, tenant: str = "team-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.key(tenant), max_retries=0, timeout=60)


def ask(c: openai.OpenAI, text: str, **kw: Any) -> Any:
    return c.chat.completions.with_raw_response.create(
        model="faq", messages=[{"role": "user", "content": text}], temperature=0, **kw
    )


def upstream_calls(mock: MockUpstream) -> int:
    return len([r for r in mock.requests() if r["path"] == "/v1/chat/completions"])


def test_paraphrase_is_answered_from_the_semantic_cache(gw: RunningGateway, mock: MockUpstream) -> None:
    c = client(gw)
    first = ask(c, "How can I reset my password?")
    assert first.headers["x-switchyard-cache"] == "miss"
    answer = first.parse().choices[0].message.content
    assert "reset my password" in answer
    second = ask(c, "How do I reset my password?")
    assert second.headers["x-switchyard-cache"] == "semantic"
    assert 0.0 < float(second.headers["x-switchyard-semantic-score"]) <= 1.0
    assert second.parse().choices[0].message.content == answer  # the original answer, replayed
    assert upstream_calls(mock) == 1
    # streamed replay of a semantic hit
    stream = c.chat.completions.create(
        model="faq",
        messages=[{"role": "user", "content": "how do i reset my password"}],
        temperature=0,
        stream=True,
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == answer
    # a near miss goes upstream, and an unrelated question too
    assert ask(c, "What is 17 * 24?").headers["x-switchyard-cache"] == "miss"
    assert ask(c, "What is 17 * 23?").headers["x-switchyard-cache"] == "miss"
    assert ask(c, "What is 17 * 23?").headers["x-switchyard-cache"] == "hit"  # exact now
    assert upstream_calls(mock) == 3

    rows = [r for r in gw.ledger_rows() if r["route"] == "faq"]
    semantic = [r for r in rows if r["cache_status"] == "semantic_hit"]
    assert len(semantic) == 2
    assert all(float(r["cost_usd"]) == 0 and r["served_model"] is None for r in semantic)
    metrics = gw.get("/metrics").text
    assert 'switchyard_cache_results_total{result="semantic_hit"} 2.0' in metrics
    assert 'switchyard_cache_results_total{result="semantic_miss"}' in metrics
    assert 'switchyard_semantic_lookup_seconds_count{route="faq"}' in metrics


def test_other_tenant_and_other_context_miss(gw: RunningGateway, mock: MockUpstream) -> None:
    ask(client(gw), "How can I reset my password?")
    other = ask(client(gw, "team-b"), "How do I reset my password?")
    assert other.headers["x-switchyard-cache"] == "miss"
    in_conversation = client(gw).chat.completions.with_raw_response.create(
        model="faq",
        temperature=0,
        messages=[
            {"role": "user", "content": "I use the admin console of our router."},
            {"role": "assistant", "content": "OK."},
            {"role": "user", "content": "How do I reset my password?"},
        ],
    )
    assert in_conversation.headers["x-switchyard-cache"] == "miss"
    assert upstream_calls(mock) == 3


def test_routes_without_semantic_cache_never_load_the_model(gateway: RunningGateway) -> None:
    c = openai.OpenAI(base_url=gateway.base_url, api_key=gateway.key(), max_retries=0, timeout=30)
    for text in ("How can I reset my password?", "How do I reset my password?"):
        raw = c.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": text}], temperature=0
        )
        assert raw.headers["x-switchyard-cache"] == "miss"
    assert gateway.app_state.services.semantic._embedder is None
