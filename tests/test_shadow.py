"""Shadow evaluation through a real gateway over the mock upstream (which echoes the user's
text): a sampled request is also sent to the candidate, judged (by checks, or by a judge
model), and the score lands as the request's feedback; every shadow call is a ledger row."""

from __future__ import annotations

import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loader import PolicyError, load_policy
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

# The candidate and judge are the cheaper model here, so the spend cap never stops a sample.
ROUTES = """
  checked:
    targets: [large]
    retries: 0
    shadow: {share: 1.0, max_spend_share: 1.0, candidate: small, verify: [math], seed: 1}
  judged:
    targets: [large]
    retries: 0
    shadow: {share: 1.0, max_spend_share: 1.0, candidate: small, judge: small, seed: 1}
  capped:
    targets: [small]
    retries: 0
    shadow: {share: 1.0, max_spend_share: 0.5, candidate: large, verify: [math], seed: 1}
"""


def _feedback(home: Path, request_id: str, deadline_s: float = 10.0) -> tuple[float, str] | None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        conn = sqlite3.connect(home / "ledger.db")
        try:
            row = conn.execute(
                "SELECT score, source FROM ledger_feedback WHERE request_id = ?", (request_id,)
            ).fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            conn.close()
        if row is not None:
            return float(row[0]), str(row[1])
        time.sleep(0.05)
    return None


def test_shadow_calls_are_rows_and_produce_feedback(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(
        tmp_path, mock_policy(mock.base_url).replace("routes:\n", "routes:\n" + ROUTES.lstrip("\n"), 1)
    )
    try:
        bad = gw.post(
            "/v1/chat/completions",
            {"model": "checked", "messages": [{"role": "user", "content": "2*3 = <<2*3=7>>7 #### 7"}]},
        )
        good = gw.post(
            "/v1/chat/completions",
            {"model": "checked", "messages": [{"role": "user", "content": "2*3 = <<2*3=6>>6 #### 6"}]},
        )
        judged = gw.post(
            "/v1/chat/completions", {"model": "judged", "messages": [{"role": "user", "content": "rate 1"}]}
        )
        assert bad.status_code == good.status_code == judged.status_code == 200
        got = {
            name: _feedback(gw.home, r.headers["x-request-id"])
            for name, r in (("bad", bad), ("good", good), ("judged", judged))
        }
        rows: dict[str, Any] = {r["request_id"]: r for r in gw.ledger_rows()}
    finally:
        gw.stop()
    assert (
        got["bad"] == (0.0, "shadow") and got["good"] == (1.0, "shadow") and got["judged"] == (1.0, "shadow")
    )
    for r in (bad, good, judged):
        row = rows[r.headers["x-request-id"] + "-shadow"]
        assert (row["served_model"], row["route_decision"]) == ("small", "shadow")
        assert Decimal(row["baseline_cost_usd"]) == 0 and Decimal(row["cost_usd"]) > 0
    judge = rows[judged.headers["x-request-id"] + "-judge"]
    assert (judge["served_model"], judge["route_decision"]) == ("small", "shadow:judge")


def test_shadow_policy_is_checked(tmp_path: Path) -> None:
    for route, why in (
        ("  s:\n    targets: [small]\n    shadow: {candidate: large}\n", "judge"),
        (
            "  s:\n    targets: [small]\n    shadow: {candidate: nope, verify: [math]}\n",
            "unknown model 'nope'",
        ),
    ):
        path = tmp_path / "p.yaml"
        path.write_text(mock_policy("http://127.0.0.1:9").replace("routes:\n", "routes:\n" + route, 1))
        with pytest.raises(PolicyError, match=why):
            load_policy(path)


def test_shadow_spend_is_capped(tmp_path: Path, mock: MockUpstream) -> None:
    """A candidate dearer than the served model: after one sample the shadow spend is over half
    the route's spend, so the next requests are not sampled."""
    gw = start_gateway(
        tmp_path, mock_policy(mock.base_url).replace("routes:\n", "routes:\n" + ROUTES.lstrip("\n"), 1)
    )
    try:
        first = gw.post(
            "/v1/chat/completions", {"model": "capped", "messages": [{"role": "user", "content": "a"}]}
        )
        assert _feedback(gw.home, first.headers["x-request-id"]) is not None
        later = [
            gw.post(
                "/v1/chat/completions", {"model": "capped", "messages": [{"role": "user", "content": "b"}]}
            )
            for _ in range(3)
        ]
        time.sleep(0.5)
        rows = {r["request_id"] for r in gw.ledger_rows()}
    finally:
        gw.stop()
    assert first.headers["x-request-id"] + "-shadow" in rows
    assert not any(r.headers["x-request-id"] + "-shadow" in rows for r in later)
