"""Budgets shared through Redis by two `switchyard serve` processes (atomic Lua reservations),
and what happens when Redis is down (fail-open to the in-process book, or fail-closed)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import redis

from gateway.core.types import Price
from gateway.limits.budgets import from_nanos, worst_case_nanos
from gateway.limits.keys import KeyStore
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway
from tests.limits_helpers import HELLO, REDIS_URL, fire, ledger_cost, redis_prefix, serve, unique

pytestmark = pytest.mark.redis
BUDGET = Decimal("0.0005")


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix("sytest-limits") as p:
        yield p


def _policy(mock_url: str, tenant: str, prefix: str, extra_limits: str = "") -> str:
    text = mock_policy(
        mock_url,
        f"limits: {{redis_url: '{REDIS_URL}', redis_prefix: '{prefix}', redis_timeout_s: 2{extra_limits}}}\n",
    )
    text = text.replace("routes:\n", "routes:\n  metered:\n    targets: [small]\n", 1)
    return text.replace("tenants:\n", f"tenants:\n  {tenant}:\n    budget: {{daily_usd: {BUDGET}}}\n", 1)


def test_two_gateway_processes_share_one_budget(tmp_path: Path, mock: MockUpstream, prefix: str) -> None:
    tenant = unique("shared")
    home = tmp_path / "home"
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(mock.base_url, tenant, prefix))
    key, _ = KeyStore(home / "keys.db").create(tenant)
    gws = [serve(home, policy, tmp_path / f"gw{i}.log") for i in range(2)]
    try:
        body = {"model": "metered", "messages": HELLO, "max_tokens": 8}
        urls = [g.url for g in gws]
        first = fire(urls, key, 200, body)
        assert {r.status_code for r in first} <= {200, 429}
        assert any(r.status_code == 429 for r in first)
        for r in first:
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "budget_exceeded"
                assert int(r.headers["retry-after"]) >= 1
        for _ in range(10):  # use what the worst-case reservations left, until nothing fits
            if not any(r.status_code == 200 for r in fire(urls, key, 200, body)):
                break
    finally:
        for g in gws:
            g.stop()
    spent = ledger_cost(home / "ledger.db", tenant)
    # the worst case of one request: the tokenizer bound of the prompt plus 8 output tokens
    from gateway.bootstrap import prompt_tokens

    worst = from_nanos(
        worst_case_nanos(
            prompt_tokens({"messages": HELLO}, "mock-small"),
            8,
            [Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"))],
        )
    )
    assert BUDGET - worst <= spent <= BUDGET + worst, (spent, worst)
    # Without Redis each process would have spent up to the whole budget on its own.
    counter = redis.Redis.from_url(REDIS_URL).get(f"{prefix}budget:tenant:{tenant}:day:" + _today())
    assert counter is not None and abs(int(counter) - int(spent * 10**9)) <= 200


def _today() -> str:
    import time

    from gateway.limits.budgets import period_bounds

    return period_bounds("day", time.time())[0]


def test_redis_down_fails_open_to_the_in_process_limiter(tmp_path: Path, mock: MockUpstream) -> None:
    tenant = "team-open"
    text = mock_policy(mock.base_url, "limits: {redis_url: 'redis://127.0.0.1:1/0', redis_timeout_s: 0.2}\n")
    text = text.replace("tenants:\n", f"tenants:\n  {tenant}:\n    rpm: 3\n    budget: {{daily_usd: 1}}\n", 1)
    gw = start_gateway(tmp_path, text)
    try:
        codes = [
            gw.post("/v1/chat/completions", {"model": "auto", "messages": HELLO}, tenant=tenant).status_code
            for _ in range(4)
        ]
        assert codes == [200, 200, 200, 429]  # the in-process limiter still enforces rpm
        metrics = gw.get("/metrics").text
        line = next(
            ln for ln in metrics.splitlines() if ln.startswith("switchyard_limits_backend_errors_total")
        )
        assert 'action="fail_open"' in line and float(line.split()[-1]) >= 4
    finally:
        gw.stop()


def test_redis_down_fails_closed_when_configured(tmp_path: Path, mock: MockUpstream) -> None:
    text = mock_policy(
        mock.base_url,
        "limits: {redis_url: 'redis://127.0.0.1:1/0', redis_timeout_s: 0.2, on_redis_error: closed, key_rpm: 100}\n",
    )
    gw = start_gateway(tmp_path, text)
    try:
        r = gw.post("/v1/chat/completions", {"model": "auto", "messages": HELLO})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "limits_unavailable"
        assert [q for q in mock.requests() if q["path"] == "/v1/chat/completions"] == []
    finally:
        gw.stop()
