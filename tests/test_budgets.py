"""Budgets: worst-case reservation, settlement, release, 429 naming the budget, spill-over,
seeding from the ledger; 200 concurrent requests never overspend by more than one request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.config.policy import Policy
from gateway.core.types import Price
from gateway.flow.services import TaskOwner
from gateway.limits.budgets import (
    BudgetLine,
    MemoryBook,
    budget_lines,
    from_nanos,
    period_bounds,
    to_nanos,
    worst_case_nanos,
)
from gateway.limits.gate import Candidate, Limits
from gateway.limits.worst_case import prompt_token_bound
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway
from tests.limits_helpers import HELLO, fire, ledger_cost

SMALL = Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"))
LARGE = Price(Decimal("2.50"), Decimal("10.00"), Decimal("1.25"), Decimal("3.125"))


# ------------------------------------------------------------------------- units
def test_worst_case_uses_the_dearest_rates_of_every_target() -> None:
    # 1000 prompt tokens at LARGE's cache-write rate 3.125 + 100 output at 10.00 per 1M
    assert worst_case_nanos(1000, 100, [SMALL, LARGE]) == 3_125_000 + 1_000_000
    assert worst_case_nanos(1000, 100, [SMALL]) == 150_000 + 60_000
    assert worst_case_nanos(0, 0, [LARGE]) == 0
    assert worst_case_nanos(1, 0, [Price(Decimal("0.0000001"), Decimal(0))]) == 1  # rounds up


def test_nanos_round_trip_and_round_up() -> None:
    assert to_nanos(Decimal("0.0000000001")) == 1
    assert to_nanos(Decimal("1.5")) == 1_500_000_000
    assert from_nanos(1_500_000_000) == Decimal("1.500000000")


def test_period_bounds_day_and_month_including_december() -> None:
    t = datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp()
    pid, start, end = period_bounds("day", t)
    assert pid == "2026-12-31" and end - start == 86400
    pid, start, end = period_bounds("month", t)
    assert pid == "2026-12"
    assert datetime.fromtimestamp(end, UTC) == datetime(2027, 1, 1, tzinfo=UTC)


def _line(name: str, limit: int) -> BudgetLine:
    return BudgetLine("tenant", name, "day", "2026-11-30", limit, time.time() + 60)


def test_memory_book_reserves_all_or_nothing() -> None:
    book = MemoryBook()
    a, b = _line("a", 100), _line("b", 50)
    assert book.reserve([a, b], 40) is None
    assert book.reserve([a, b], 20) == 1  # b would overrun: nothing held anywhere
    assert (book.spent(a), book.spent(b)) == (40, 40)
    book.adjust([a, b], -40)
    assert book.reserve([a, b], 50) is None
    assert book.reserve([a, b], 0) is None  # a free request passes even on a full budget


def test_budget_lines_from_policy_and_key() -> None:
    policy = Policy.model_validate(
        {
            "providers": {"p": {"type": "openai", "base_url": "http://x", "key_required": False}},
            "models": {"m": {"provider": "p", "price": {"input": 1, "output": 1}}},
            "routes": {"r": {"targets": ["m"], "budget": {"monthly_usd": 5}}},
            "tenants": {"t": {"budget": {"daily_usd": "0.5", "monthly_usd": 3}}},
        }
    )
    from gateway.config.policy import BudgetPolicy

    lines = budget_lines(policy, "t", "k1", BudgetPolicy(daily_usd=Decimal(1)), "r", time.time())
    got = {(ln.scope, ln.name, ln.period, ln.limit) for ln in lines}
    assert got == {
        ("key", "k1", "day", 1_000_000_000),
        ("tenant", "t", "day", 500_000_000),
        ("tenant", "t", "month", 3_000_000_000),
        ("route", "r", "month", 5_000_000_000),
    }
    assert budget_lines(policy, "other", None, None, "m", time.time()) == []


async def test_reserve_settle_release_in_process() -> None:
    policy = Policy.model_validate(
        {
            "providers": {"p": {"type": "openai", "base_url": "http://x", "key_required": False}},
            "models": {"m": {"provider": "p", "price": {"input": 1, "output": 2}}},
            "routes": {"r": {"targets": ["m"]}},
            "tenants": {"t": {"budget": {"daily_usd": "0.001"}}},
        }
    )
    limits = Limits(spawn=TaskOwner().spawn)
    body = {"messages": HELLO, "max_tokens": 100}
    cand = Candidate("r", (Price(Decimal(1), Decimal(2)),), 4096)
    index, res = await limits.reserve(policy, "t", None, body, [cand])
    assert index == 0 and res is not None
    assert res.amount == prompt_token_bound(body) * 1000 + 100 * 2000
    limits.settle(res, Decimal("0.0000123"))
    status = await limits.status(policy)
    assert [r["spent_usd"] for r in status] == [Decimal("0.000012300")]
    _, res2 = await limits.reserve(policy, "t", None, body, [cand])
    limits.release(res2)
    limits.release(res2)  # twice is harmless
    assert (await limits.status(policy))[0]["spent_usd"] == Decimal("0.000012300")


# ------------------------------------------------------------------------- gateway
BUDGET = Decimal("0.0005")
EXTRA = """
  metered:
    targets: [small]
    max_output_tokens: 64
  spilling:
    targets: [large]
    budget: {daily_usd: 0.00002}
    on_budget_exceeded: {spill_to: free}
"""
FREE = "  free: {provider: mock, upstream: mock-free, price: {input: 0, output: 0}}\n"


def budget_policy(mock_url: str, tenant_budget: Decimal = BUDGET) -> str:
    text = mock_policy(mock_url, "limits: {default_max_output_tokens: 256}\n")
    text = text.replace("routes:\n", "routes:" + EXTRA, 1)
    text = text.replace("models:\n", "models:\n" + FREE, 1)
    return text.replace("tenants:\n", f"tenants:\n  capped:\n    budget: {{daily_usd: {tenant_budget}}}\n", 1)


@pytest.fixture
def budget_gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path, budget_policy(mock.base_url))
    try:
        yield gw
    finally:
        gw.stop()


def test_200_concurrent_requests_never_overspend_the_budget(budget_gw: RunningGateway) -> None:
    key = budget_gw.key("capped")
    body = {"model": "metered", "messages": HELLO, "max_tokens": 8}
    responses = fire([budget_gw.url], key, 200, body)
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == 200, {r.status_code for r in responses}
    assert ok and refused
    for r in refused:
        err = r.json()["error"]
        assert err["code"] == "budget_exceeded" and err["type"] == "rate_limit_error"
        assert "daily budget of 0.0005 USD for tenant 'capped'" in err["message"]
        retry = int(r.headers["retry-after"])
        assert 1 <= retry <= 86400
        midnight = period_bounds("day", time.time())[2]
        assert abs(retry - (midnight - time.time())) < 30
    budget_gw.app_state.services.ledger.flush(5.0)
    spent = ledger_cost(budget_gw.home / "ledger.db", "capped")
    state = budget_gw.app_state
    worst = from_nanos(
        worst_case_nanos(
            state.services.limits._prompt_tokens({"messages": HELLO}, "mock-small"),
            8,
            [state.services.router.plan("metered", _principal("capped"), "chat").targets[0].price],
        )
    )
    assert spent <= BUDGET + worst, (spent, worst)
    # Reservations are worst cases, so the first burst leaves money unspent; more bursts
    # (after settlement) use it until not one more worst case fits.
    for _ in range(10):
        if not any(r.status_code == 200 for r in fire([budget_gw.url], key, 200, body)):
            break
    budget_gw.app_state.services.ledger.flush(5.0)
    spent = ledger_cost(budget_gw.home / "ledger.db", "capped")
    assert BUDGET - worst <= spent <= BUDGET + worst, (spent, worst)
    # the in-process counter agrees with the ledger once everything settled
    status = {(r["scope"], r["name"], r["period"]): r for r in _status(budget_gw)}
    assert Decimal(status[("tenant", "capped", "day")]["spent_usd"]) >= spent - Decimal("0.000000001") * len(
        ok
    )


def _principal(tenant: str):  # type: ignore[no-untyped-def]
    from gateway.core.types import Principal

    return Principal(tenant)


def _status(gw: RunningGateway) -> list[dict[str, str]]:
    from tests.gateway_harness import ADMIN_KEY

    r = gw.get("/admin/budgets", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    rows: list[dict[str, str]] = r.json()["budgets"]
    return rows


def test_failed_calls_release_their_reservation(budget_gw: RunningGateway, mock: MockUpstream) -> None:
    mock.add_fault(kind="status", status=500, model="mock-small", times=10)
    body = {"model": "metered", "messages": HELLO, "max_tokens": 8}
    r = budget_gw.post("/v1/chat/completions", body, tenant="capped")
    assert r.status_code == 502
    row = next(x for x in _status(budget_gw) if x["scope"] == "tenant" and x["period"] == "day")
    assert Decimal(row["spent_usd"]) == 0
    assert Decimal(row["remaining_usd"]) == BUDGET


def test_spill_to_a_free_target_instead_of_refusing(budget_gw: RunningGateway) -> None:
    body = {"model": "spilling", "messages": HELLO, "max_tokens": 8}
    # worst case on `large` (2.5/10 per 1M) for a short prompt and 8 tokens is ~1.5e-4 USD,
    # over the route's 2e-5 daily budget: every request spills to the free model.
    r = budget_gw.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.headers["x-switchyard-model"] == "free"
    assert r.headers["x-switchyard-route"] == "free"


def test_over_budget_metrics_and_rejection_reason(budget_gw: RunningGateway) -> None:
    key = budget_gw.key("capped")
    fire([budget_gw.url], key, 120, {"model": "metered", "messages": HELLO, "max_tokens": 8})
    text = budget_gw.get("/metrics").text
    assert 'switchyard_rejections_total{code="budget_exceeded"}' in text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("switchyard_budget_remaining_usd{")
        and 'scope="tenant"' in ln
        and 'name="capped"' in ln
        and 'period="day"' in ln
    )
    assert 0 <= float(line.split()[-1]) < float(BUDGET)


def test_budget_is_seeded_from_the_ledger_at_start(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, budget_policy(mock.base_url))
    try:
        for _ in range(3):
            r = gw.post("/v1/chat/completions", {"model": "metered", "messages": HELLO}, tenant="capped")
            assert r.status_code == 200
        gw.app_state.services.ledger.flush(5.0)
        spent = ledger_cost(gw.home / "ledger.db", "capped")
    finally:
        gw.stop()
    assert spent > 0
    gw2 = start_gateway(tmp_path, budget_policy(mock.base_url))
    try:
        row = next(x for x in _status(gw2) if x["scope"] == "tenant" and x["period"] == "day")
        assert Decimal(row["spent_usd"]) == Decimal(to_nanos(spent)) / 10**9
    finally:
        gw2.stop()


def test_key_budget_set_through_the_admin_api(budget_gw: RunningGateway) -> None:
    from tests.gateway_harness import ADMIN_KEY

    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with __import__("httpx2").Client(timeout=10) as c:
        created = c.post(
            budget_gw.url + "/admin/keys", json={"tenant": "team-k", "daily_usd": "0.00003"}, headers=admin
        )
        assert created.status_code == 201, created.text
        key = created.json()["key"]
        headers = {"authorization": f"Bearer {key}"}
        codes = []
        for _ in range(12):
            r = c.post(
                budget_gw.url + "/v1/chat/completions",
                json={"model": "metered", "messages": HELLO, "max_tokens": 8},
                headers=headers,
            )
            codes.append(r.status_code)
        assert 200 in codes and 429 in codes
        assert f"for key '{created.json()['key_id']}'" in r.json()["error"]["message"]


def test_policy_budget_fields_are_checked(tmp_path: Path) -> None:
    from gateway.config.loader import PolicyError, load_policy

    base = """
providers: {p: {type: openai, base_url: "http://x", key_required: false}}
models: {m: {provider: p, price: {input: 1, output: 1}}}
routes:
  r:
    targets: [m]
    on_budget_exceeded: {spill_to: nowhere}
    budget: {daily_usd: -1}
limits: {on_redis_error: sometimes}
"""
    path = tmp_path / "p.yaml"
    path.write_text(base)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    paths = {p for p, _ in info.value.problems}
    assert "routes.r.budget.daily_usd" in paths and "limits.on_redis_error" in paths
    path.write_text(
        base.replace("budget: {daily_usd: -1}", "budget: {daily_usd: 2}").replace("sometimes", "closed")
    )
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.problems == [
        ("routes.r.on_budget_exceeded.spill_to", "unknown route or model 'nowhere'")
    ]
    path.write_text(base.replace("nowhere", "m").replace("-1", "2").replace("sometimes", "closed"))
    policy = load_policy(path)
    assert policy.routes["r"].budget.daily_usd == Decimal(2)
