"""Conversation stickiness (gateway/routing/sticky.py): a conversation keeps the model that
served it, so the provider's prompt cache stays warm; unit tests plus a real gateway where a
failed first target moves the conversation and keeps it moved."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from gateway.core.types import Price, Target
from gateway.routing.plan import RoutePlan
from gateway.routing.sticky import StickyConversations, conversation_key
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

SYSTEM = {"role": "system", "content": "you are a coding agent"}
TURN1 = [SYSTEM, {"role": "user", "content": "fix the bug"}]
TURN2 = [*TURN1, {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]


def test_a_conversation_keeps_its_key_across_turns() -> None:
    first = conversation_key("t", "r", {"messages": TURN1})
    assert first is not None and first == conversation_key("t", "r", {"messages": TURN2})
    assert first != conversation_key("other", "r", {"messages": TURN1})
    assert first != conversation_key("t", "other", {"messages": TURN1})
    assert conversation_key("t", "r", {"messages": [{"role": "user", "content": "hi"}]}) is None
    anthropic = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    assert conversation_key("t", "r", anthropic) is not None
    keyed = conversation_key("t", "r", {"prompt_cache_key": "s1", "messages": TURN1})
    assert keyed == conversation_key("t", "r", {"prompt_cache_key": "s1", "messages": [SYSTEM]})
    assert keyed == conversation_key("t", "r", {"metadata": {"user_id": "s1"}, "messages": []})


def _plan(*models: str) -> RoutePlan:
    price = Price(Decimal(1), Decimal(1))
    targets = tuple(Target(m, "p", m, price) for m in models)
    return RoutePlan("r", "chat", targets, (), targets[0], None, True)  # type: ignore[arg-type]


def test_prefer_moves_the_remembered_model_first_and_forgets() -> None:
    now = [0.0]
    sticky = StickyConversations(max_entries=2, ttl_s=10, clock=lambda: now[0])
    plan = _plan("a", "b", "c")
    assert sticky.prefer("k", plan) == (plan, False)
    sticky.remember("k", "c")
    moved, changed = sticky.prefer("k", plan)
    assert changed and [t.model for t in moved.targets] == ["c", "a", "b"]
    sticky.remember("k", "gone")  # no longer a target of the route: the plan stands
    assert sticky.prefer("k", plan) == (plan, False)
    sticky.remember("k", "b")
    now[0] = 11.0  # idle past the TTL
    assert sticky.prefer("k", plan) == (plan, False)
    for key in ("x", "y", "z"):
        sticky.remember(key, "a")
    assert len(sticky) == 2


def test_a_moved_conversation_stays_on_its_new_model(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        mock.add_fault(kind="status", status=500, model="claude-mock", times=1)
        first = gw.post("/v1/chat/completions", {"model": "anthropic-first", "messages": TURN1})
        second = gw.post("/v1/chat/completions", {"model": "anthropic-first", "messages": TURN2})
        fresh = gw.post(
            "/v1/chat/completions",
            {"model": "anthropic-first", "messages": [SYSTEM, {"role": "user", "content": "new task"}]},
        )
        assert [r.status_code for r in (first, second, fresh)] == [200, 200, 200]
        assert first.headers["x-switchyard-model"] == "small"  # claude failed: the fallback served
        assert second.headers["x-switchyard-model"] == "small"  # and keeps the conversation
        assert fresh.headers["x-switchyard-model"] == "claude"  # a new conversation starts first
        decisions = {r["request_id"]: r["route_decision"] for r in gw.ledger_rows()}
        assert decisions[second.headers["x-request-id"]] == "sticky"
    finally:
        gw.stop()
