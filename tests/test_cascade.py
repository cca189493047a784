"""The verifier cascade through a real gateway over the mock upstream (which echoes the user's
text, so the prompt decides what the cheap model "answered"): an answer that passes is served
by the cheap target (one row); one that fails escalates (two rows: the cheap attempt with a
zero baseline, the strong answer); streams are declined; a plug-in check decides too."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loader import PolicyError, load_policy
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

ROUTES = """
  cascaded:
    targets: [small, large]
    baseline: large
    retries: 0
    cascade: {verify: [math, refusal]}
  plugged:
    targets: [small, large]
    baseline: large
    retries: 0
    cascade: {check: "tests.test_cascade:no_pad"}
  graded:
    targets: [small, large]
    baseline: large
    retries: 0
    cascade: {verify: [math, refusal], escalate_above: 0.5}
  sampled:
    targets: [small, large]
    baseline: large
    retries: 0
    cascade: {verify: [math], second_sample: true, check: "tests.test_cascade:arm_second_sample"}
  shared:
    targets: [small, large]
    baseline: large
    retries: 0
    cascade: {verify: [math], escalate_share: 0.5}
"""


def no_pad(completion: dict[str, Any], request: dict[str, Any]) -> str | None:
    """A plug-in check: escalate answers the mock padded (shorter than asked)."""
    text = completion["choices"][0]["message"]["content"]
    return "padded" if "pad" in text else None


ARMED: list[MockUpstream] = []  # a mock whose next answer differs (the second sample's)


def arm_second_sample(completion: dict[str, Any], request: dict[str, Any]) -> str | None:
    """A plug-in that runs between the two samples: when armed, the second one is filler."""
    if ARMED:
        ARMED.pop().add_fault(kind="huge", bytes=64)
    return None


def _chat(gw: Any, route: str, text: str, **extra: Any) -> Any:
    body = {"model": route, "messages": [{"role": "user", "content": text}], **extra}
    return gw.post("/v1/chat/completions", body)


def test_cascade_accepts_escalates_and_declines_streams(tmp_path: Path, mock: MockUpstream) -> None:
    policy = mock_policy(mock.base_url).replace("routes:\n", "routes:\n" + ROUTES.lstrip("\n"), 1)
    gw = start_gateway(tmp_path, policy)
    try:
        ok = _chat(gw, "cascaded", "2*3 = <<2*3=6>>6 #### 6")
        bad = _chat(gw, "cascaded", "2*3 = <<2*3=7>>7 #### 7")
        stream = _chat(gw, "cascaded", "2*3 = <<2*3=7>>7 #### 7", stream=True)
        plugged = _chat(gw, "plugged", "hi")
        rows = {r["request_id"]: r for r in gw.ledger_rows()}
    finally:
        gw.stop()
    assert ok.status_code == bad.status_code == stream.status_code == plugged.status_code == 200
    assert ok.headers["x-switchyard-cascade"] == "accepted" and ok.headers["x-switchyard-model"] == "small"
    assert bad.headers["x-switchyard-cascade"] == "escalated" and bad.headers["x-switchyard-model"] == "large"
    assert stream.headers["x-switchyard-cascade"] == "declined-stream"
    assert plugged.headers["x-switchyard-cascade"] == "escalated"
    accepted = rows[ok.headers["x-request-id"]]
    assert accepted["route_decision"] == "cascade:accepted" and accepted["served_model"] == "small"
    assert ok.headers["x-request-id"] + "-1" not in rows
    strong, cheap = rows[bad.headers["x-request-id"]], rows[bad.headers["x-request-id"] + "-1"]
    assert (strong["served_model"], strong["route_decision"]) == ("large", "cascade:strong")
    assert (cheap["served_model"], cheap["route_decision"]) == ("small", "cascade:escalated")
    assert Decimal(cheap["baseline_cost_usd"]) == 0 and Decimal(cheap["cost_usd"]) > 0  # all extra
    assert Decimal(strong["baseline_cost_usd"]) == Decimal(strong["cost_usd"])  # the baseline itself
    assert strong["attempts"] == 1 and cheap["attempts"] == 1


def test_graded_cascade_escalates_by_suspicion(tmp_path: Path, mock: MockUpstream) -> None:
    """The graded math check in the live route: above a fixed score, and the top share of the
    route's recent scores (the mock echoes the prompt, so the prompt is the cheap answer)."""
    policy = mock_policy(mock.base_url).replace("routes:\n", "routes:\n" + ROUTES.lstrip("\n"), 1)
    gw = start_gateway(tmp_path, policy)
    clean, wrong = "2*3 = <<2*3=6>>6 #### 6", "2*3 = <<2*3=7>>7 #### 7"
    try:
        above = [_chat(gw, "graded", text) for text in (clean, wrong)]
        shared = [_chat(gw, "shared", text) for text in (clean, wrong, "2*3 = <<2*3=7>>7", clean)]
        rows = {r["request_id"]: r for r in gw.ledger_rows()}
    finally:
        gw.stop()
    assert [r.headers["x-switchyard-cascade"] for r in above] == ["accepted", "escalated"]
    # the top half of the scores so far: each new worst escalates, the clean one after them not
    assert [r.headers["x-switchyard-cascade"] for r in shared] == [
        "accepted",
        "escalated",
        "escalated",
        "accepted",
    ]
    cheap = rows[above[1].headers["x-request-id"] + "-1"]
    assert cheap["route_decision"] == "cascade:escalated" and Decimal(cheap["baseline_cost_usd"]) == 0


def test_second_sample_escalates_on_disagreement(tmp_path: Path, mock: MockUpstream) -> None:
    """Self-consistency: the mock echoes the prompt, so two samples agree, unless the second is
    made to differ (a fault armed between the samples): then the answer escalates. Every
    sample is its own row with a zero baseline."""
    policy = mock_policy(mock.base_url).replace("routes:\n", "routes:\n" + ROUTES.lstrip("\n"), 1)
    gw = start_gateway(tmp_path, policy)
    try:
        same = _chat(gw, "sampled", "2*3 = <<2*3=6>>6 #### 6")
        ARMED.append(mock)
        differs = _chat(gw, "sampled", "2*3 = <<2*3=6>>6 #### 6")
        rows = {r["request_id"]: r for r in gw.ledger_rows()}
    finally:
        ARMED.clear()
        gw.stop()
    assert (
        same.headers["x-switchyard-cascade"] == "accepted" and same.headers["x-switchyard-model"] == "small"
    )
    assert (
        differs.headers["x-switchyard-cascade"] == "escalated"
        and differs.headers["x-switchyard-model"] == "large"
    )
    for rid in (same.headers["x-request-id"], differs.headers["x-request-id"]):
        sample = rows[rid + "-2"]
        assert (sample["served_model"], sample["route_decision"]) == ("small", "cascade:sample")
        assert Decimal(sample["baseline_cost_usd"]) == 0 and Decimal(sample["cost_usd"]) > 0
    assert same.headers["x-request-id"] + "-1" not in rows
    assert rows[differs.headers["x-request-id"] + "-1"]["route_decision"] == "cascade:escalated"
    assert rows[differs.headers["x-request-id"]]["route_decision"] == "cascade:strong"


def test_cascade_policy_is_checked(tmp_path: Path) -> None:
    for route, why in (
        ("  c:\n    targets: [small]\n    cascade: {verify: [math]}\n", "two targets"),
        ("  c:\n    targets: [small, large]\n    cascade: {}\n", "needs 'verify'"),
        ("  c:\n    targets: [small, large]\n    cascade: {verify: [vibes]}\n", "verify"),
    ):
        path = tmp_path / "p.yaml"
        path.write_text(mock_policy("http://127.0.0.1:9").replace("routes:\n", "routes:\n" + route, 1))
        with pytest.raises(PolicyError, match=why):
            load_policy(path)
