"""Automatic cache_control markers for chat clients routed to Anthropic
(providers.X.auto_cache_control): where they go, when they are left out, and a repeated
multi-turn conversation through a real gateway costing less with them than without."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from gateway.protocols.anthropic_outbound import (
    MIN_CACHEABLE_CHARS,
    add_cache_breakpoints,
    to_anthropic_request,
)
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

LONG = "You are a careful coding agent. Follow the house style. " * 100  # > MIN_CACHEABLE_CHARS
KEY_LINE = "    api_key: sk-ant-canary-0123456789abcdef\n"


def marks(request: dict) -> int:  # type: ignore[type-arg]
    blocks = [*request.get("system", []), *request.get("tools", [])]
    for m in request["messages"]:
        blocks += m["content"] if isinstance(m["content"], list) else []
    return sum(1 for b in blocks if b.get("cache_control"))


def chat(*turns: str) -> dict:  # type: ignore[type-arg]
    msgs = [{"role": "system", "content": LONG}]
    for i, text in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "claude", "messages": msgs}


def test_markers_go_on_the_stable_prefix_only_when_it_can_be_cached() -> None:
    assert len(LONG) >= MIN_CACHEABLE_CHARS
    req = add_cache_breakpoints(to_anthropic_request(chat("a", "b", "c"), "m"))
    assert req["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert req["messages"][-2]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # the earlier turn
    assert "cache_control" not in req["messages"][-1]["content"][-1]  # never the newest message
    short = {
        "model": "claude",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    }
    assert marks(add_cache_breakpoints(to_anthropic_request(short, "m"))) == 0  # too short to be cached
    mine = to_anthropic_request(chat("a"), "m")
    mine["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert marks(add_cache_breakpoints(mine)) == 1  # the client's own markers are left alone
    assert marks(add_cache_breakpoints(to_anthropic_request(chat("a", "b", "c", "d", "e"), "m"))) <= 4


def _conversation_cost(tmp_path: Path, mock: MockUpstream, auto: bool) -> tuple[Decimal, list[int]]:
    policy = mock_policy(mock.base_url)
    if auto:
        policy = policy.replace(KEY_LINE, KEY_LINE + "    auto_cache_control: true\n")
    gw = start_gateway(tmp_path, policy)
    try:
        turns = ["fix the bug", "done", "now add a test", "added", "and the docs"]
        for n in (1, 3, 5):
            r = gw.post("/v1/chat/completions", {**chat(*turns[:n]), "max_tokens": 10})
            assert r.status_code == 200, r.text
        rows = [r for r in gw.ledger_rows() if r["endpoint"] == "chat"]
    finally:
        gw.stop()
    return sum((Decimal(r["cost_usd"]) for r in rows), Decimal(0)), [r["cached_tokens"] or 0 for r in rows]


def test_a_repeated_conversation_costs_less_with_automatic_markers(
    tmp_path: Path, mock: MockUpstream
) -> None:
    plain, plain_reads = _conversation_cost(tmp_path / "off", mock, auto=False)
    mock.reset()
    cached, reads = _conversation_cost(tmp_path / "on", mock, auto=True)
    assert plain_reads == [0, 0, 0] and reads[0] == 0 and reads[1] > 0 and reads[2] > 0
    assert cached < plain * Decimal("0.7"), (cached, plain)
