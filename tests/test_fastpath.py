"""The pure-ASGI fast path and FastAPI's own routing serve the hot endpoints identically
(SWITCHYARD_FASTPATH=0 exists only to measure the difference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import Settings
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def test_fastpath_setting_from_env() -> None:
    assert Settings.from_env({}).fastpath is True
    assert Settings.from_env({"SWITCHYARD_FASTPATH": "0"}).fastpath is False


@pytest.mark.parametrize("fastpath", [True, False])
def test_same_answers_with_and_without_fastpath(tmp_path: Path, mock: MockUpstream, fastpath: bool) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url), fastpath=fastpath)
    try:
        first = gw.post("/v1/chat/completions", CHAT)
        second = gw.post("/v1/chat/completions", CHAT)
        assert first.status_code == 200 and first.headers["x-switchyard-cache"] == "miss"
        assert second.headers["x-switchyard-cache"] == "hit"
        bad = gw.post("/v1/chat/completions", {"model": "auto", "messages": [], "temperature": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
        unknown = gw.post("/v1/chat/completions", {**CHAT, "model": "nope"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        stream = gw.post("/v1/chat/completions", {**CHAT, "stream": True, "temperature": 0.5})
        assert stream.text.rstrip().endswith("data: [DONE]")
    finally:
        gw.stop()
