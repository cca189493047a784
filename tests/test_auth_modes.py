"""Authentication modes: keys (default) and the explicit unauthenticated mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2 as httpx

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def test_keys_mode_is_the_default_and_refuses_anonymous_calls(gateway: RunningGateway) -> None:
    with httpx.Client() as client:
        r = client.post(gateway.base_url + "/chat/completions", json=CHAT)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"


def test_unauthenticated_mode_only_when_the_policy_says_so(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url) + "\nserver: {auth: none}\n")
    try:
        with httpx.Client() as client:
            r = client.post(gw.base_url + "/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        row = gw.ledger_rows()[-1]
        assert (row["tenant"], row["key_id"]) == ("anonymous", None)
    finally:
        gw.stop()


def test_key_created_by_the_cli_works_on_a_running_gateway(gateway: RunningGateway) -> None:
    env = {"SWITCHYARD_HOME": str(gateway.home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "create", "--tenant", "late-team"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key = out.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-sy-")
    with httpx.Client() as client:
        r = client.post(
            gateway.base_url + "/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
        )
    assert r.status_code == 200, r.text
    assert gateway.ledger_rows()[-1]["tenant"] == "late-team"
