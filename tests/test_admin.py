"""Admin API: admin key required (tenant keys refused), keys, key limits, budgets, spend by
time bucket and group, savings by cause, CSV export."""

from __future__ import annotations

import base64
import csv
import io
from decimal import Decimal
from typing import Any

import httpx2 as httpx
import pytest

from tests.gateway_harness import ADMIN_KEY, RunningGateway

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
HELLO = [{"role": "user", "content": "hello there"}]


def call(
    gw: RunningGateway, method: str, path: str, headers: dict[str, str] | None = None, **kw: Any
) -> httpx.Response:
    with httpx.Client(timeout=10) as c:
        return c.request(method, gw.url + path, headers=ADMIN if headers is None else headers, **kw)


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/admin/keys"),
        ("POST", "/admin/keys"),
        ("DELETE", "/admin/keys/abc"),
        ("PUT", "/admin/keys/abc/limits"),
        ("GET", "/admin/budgets"),
        ("GET", "/admin/spend"),
        ("GET", "/admin/savings"),
    ],
)
def test_admin_routes_need_the_admin_key(gateway: RunningGateway, method: str, path: str) -> None:
    missing = call(gateway, method, path, headers={})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    tenant = call(gateway, method, path, headers=gateway.headers("team-a"))
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "not_admin"
    wrong = call(gateway, method, path, headers={"authorization": "Bearer " + ADMIN_KEY[:-1] + "x"})
    assert wrong.status_code == 403
    assert ADMIN_KEY not in missing.text + tenant.text + wrong.text


def test_basic_auth_with_the_admin_key_as_password(gateway: RunningGateway) -> None:
    token = base64.b64encode(f"admin:{ADMIN_KEY}".encode()).decode()
    assert call(gateway, "GET", "/admin/keys", headers={"authorization": f"Basic {token}"}).status_code == 200
    bad = base64.b64encode(b"admin:nope").decode()
    assert call(gateway, "GET", "/admin/keys", headers={"authorization": f"Basic {bad}"}).status_code == 403


def test_create_list_limit_revoke_keys(gateway: RunningGateway) -> None:
    r = call(
        gateway,
        "POST",
        "/admin/keys",
        json={"tenant": "team-x", "name": "ci", "rpm": 7, "monthly_usd": "12.5"},
    )
    assert r.status_code == 201, r.text
    created = r.json()
    key, key_id = created["key"], created["key_id"]
    assert key.startswith("sk-sy-") and created["limits"] == {
        "rpm": 7,
        "tpm": None,
        "daily_usd": None,
        "monthly_usd": "12.5",
    }
    # the new key works at once
    ok = gateway.post(
        "/v1/chat/completions",
        {"model": "auto", "messages": HELLO},
        headers={"authorization": f"Bearer {key}"},
    )
    assert ok.status_code == 200
    listed = {k["key_id"]: k for k in call(gateway, "GET", "/admin/keys").json()["keys"]}
    assert listed[key_id]["tenant"] == "team-x" and listed[key_id]["limits"]["rpm"] == 7
    assert key not in call(gateway, "GET", "/admin/keys").text  # never the key itself
    r = call(gateway, "PUT", f"/admin/keys/{key_id}/limits", json={"daily_usd": "0.5", "tpm": 1000})
    assert r.status_code == 200 and r.json()["limits"]["daily_usd"] == "0.5"
    budgets = call(gateway, "GET", "/admin/budgets").json()["budgets"]
    assert {(b["scope"], b["name"], b["period"]) for b in budgets} >= {("key", key_id, "day")}
    assert call(gateway, "DELETE", f"/admin/keys/{key_id}").json() == {"key_id": key_id, "revoked": True}
    assert call(gateway, "DELETE", f"/admin/keys/{key_id}").status_code == 404
    gone = gateway.post(
        "/v1/chat/completions",
        {"model": "auto", "messages": HELLO},
        headers={"authorization": f"Bearer {key}"},
    )
    assert gone.status_code == 401
    assert key_id not in {k["key_id"] for k in call(gateway, "GET", "/admin/keys").json()["keys"]}
    assert key_id in {k["key_id"] for k in call(gateway, "GET", "/admin/keys?all=1").json()["keys"]}


@pytest.mark.parametrize(
    "body,param",
    [
        ({"name": "no tenant"}, "tenant"),
        ({"tenant": "bad tenant!"}, "tenant"),
        ({"tenant": "t", "rpm": 0}, "rpm"),
        ({"tenant": "t", "daily_usd": "-1"}, "daily_usd"),
        ({"tenant": "t", "daily_usd": "NaN"}, "daily_usd"),
        ({"tenant": "t", "surprise": 1}, "surprise"),
    ],
)
def test_bad_admin_input_is_a_400_and_changes_nothing(
    gateway: RunningGateway, body: dict[str, Any], param: str
) -> None:
    before = call(gateway, "GET", "/admin/keys?all=1").json()
    r = call(gateway, "POST", "/admin/keys", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert call(gateway, "GET", "/admin/keys?all=1").json() == before


def test_bad_report_parameters(gateway: RunningGateway) -> None:
    assert call(gateway, "GET", "/admin/spend?group_by=colour").status_code == 400
    assert call(gateway, "GET", "/admin/spend?bucket=week").status_code == 400
    assert call(gateway, "GET", "/admin/spend?since=yesterday").status_code == 400
    assert call(gateway, "GET", "/admin/spend?format=xml").status_code == 400
    assert call(gateway, "PUT", "/admin/keys/nokey/limits", json={"rpm": 5}).status_code == 404


def test_spend_and_savings_reports_json_and_csv(gateway: RunningGateway) -> None:
    for tenant in ("team-a", "team-b"):
        for _ in range(2):
            r = gateway.post(
                "/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0}, tenant=tenant
            )
            assert r.status_code == 200
    rows = gateway.ledger_rows()
    total = sum(Decimal(r["cost_usd"]) for r in rows if r["cost_usd"] is not None)
    assert total > 0
    by_tenant = call(gateway, "GET", "/admin/spend?group_by=tenant&bucket=day").json()
    assert by_tenant["group_by"] == "tenant" and by_tenant["bucket"] == "day"
    assert {r["group"] for r in by_tenant["spend"]} == {"team-a", "team-b"}
    assert sum(Decimal(r["cost_usd"]) for r in by_tenant["spend"]) == total
    assert all(len(r["bucket"]) == 10 for r in by_tenant["spend"])  # YYYY-MM-DD
    csv_resp = call(gateway, "GET", "/admin/spend?group_by=model&bucket=hour&format=csv")
    assert csv_resp.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(csv_resp.text)))
    assert {r["group"] for r in parsed} >= {"small"}
    assert sum(Decimal(r["cost_usd"]) for r in parsed) == total
    savings = call(gateway, "GET", "/admin/savings").json()["savings"]
    causes = {r["cause"]: Decimal(r["savings_usd"]) for r in savings}
    assert causes["exact_cache"] > 0  # the repeated deterministic requests hit the cache
    assert sum(causes.values()) == sum(
        Decimal(r["baseline_cost_usd"]) - Decimal(r["cost_usd"])
        for r in rows
        if r["baseline_cost_usd"] is not None and r["cost_usd"] is not None
    )
    scsv = call(gateway, "GET", "/admin/savings?format=csv&bucket=day").text
    assert scsv.splitlines()[0].startswith("cause,bucket") or "cause" in scsv.splitlines()[0]
