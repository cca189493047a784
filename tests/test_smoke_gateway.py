from __future__ import annotations

from tests.gateway_harness import RunningGateway


def test_chat_roundtrip_and_ledger(gateway: RunningGateway) -> None:
    r = gateway.post(
        "/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-switchyard-model"] == "small"
    rows = gateway.ledger_rows()
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["served_model"] == "small"
