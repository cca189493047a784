"""Security properties, through a real gateway: keys only as hashes, compared in constant
time; no /admin or dashboard endpoint answers a tenant key; tenants never see each other's
cache entries, ledger rows or spend; clients cannot steer the gateway to another upstream or
slip their own credentials upstream; prompts and completions stay out of logs unless the
policy opts in. (Canary secrets in logs, errors, metrics and the ledger: test_secrets.py.)"""

from __future__ import annotations

import ast
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.limits.keys import hash_key
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway, mock_policy, start_gateway

REPO = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
OPENAI_CANARY = "sk-upstream-canary-0123456789abcdef"


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}], **extra}


# ----------------------------------------------------------------------------- keys
def _secret_checks(path: Path) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    tree = ast.parse(path.read_text())
    wanted = {"lookup_hash", "require_admin"}
    return [
        (f"{path.name}:{node.name}", node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted
    ]


def test_secret_comparisons_are_constant_time() -> None:
    """Every function that checks a presented key against a stored one uses
    hmac.compare_digest and never ``==``/``!=`` on key material."""
    checked = []
    for rel in ("gateway/limits/keys.py", "gateway/api/auth.py", "gateway/api/admin.py"):
        path = REPO / rel
        if not path.exists():
            continue
        for name, fn in _secret_checks(path):
            calls = [
                n
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "compare_digest"
            ]
            if not calls:
                # a thin wrapper that delegates to another checker is fine
                delegates = [
                    n
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Call)
                    and getattr(n.func, "id", getattr(n.func, "attr", ""))
                    in ("require_admin", "lookup_hash", "_check_admin")
                ]
                assert delegates, f"{name} compares a secret without hmac.compare_digest"
            for cmp in (n for n in ast.walk(fn) if isinstance(n, ast.Compare)):
                if any(isinstance(op, (ast.Eq, ast.NotEq)) for op in cmp.ops):
                    text = ast.unparse(cmp).lower()
                    assert not any(w in text for w in ("key", "digest", "hash")) or "is none" in text, (
                        f"{name}: '{ast.unparse(cmp)}' compares key material with ==/!="
                    )
            checked.append(name)
    assert "keys.py:lookup_hash" in checked and "auth.py:require_admin" in checked


def test_key_store_holds_hashes_only(gateway: RunningGateway) -> None:
    key = gateway.key("team-a")
    assert gateway.post(CHAT, chat("hello")).status_code == 200
    conn = sqlite3.connect(gateway.home / "keys.db")
    try:
        dump = "\n".join(conn.iterdump())
        rows = conn.execute("SELECT key_id, key_hash FROM api_keys").fetchall()
    finally:
        conn.close()
    assert key not in dump and key.removeprefix("sk-sy-") not in dump
    assert (hash_key(key)[:12], hash_key(key)) in rows


# ----------------------------------------------------------------------------- admin surface
def test_no_admin_endpoint_answers_a_tenant_key(gateway: RunningGateway) -> None:
    spec = gateway.get("/openapi.json").json()
    probes = [
        (method.upper(), path.replace("{key_id}", "0123456789ab").replace("{name}", "dashboard.js"))
        for path, ops in spec["paths"].items()
        if path.startswith(("/admin", "/dashboard"))
        for method in ops
    ]
    probes += [("GET", "/dashboard"), ("POST", "/admin/policy/reload")]
    assert ("POST", "/admin/policy/reload") in probes
    # The sign-in form is public by design (it shows nothing but the form); signing in with a
    # tenant key (POST) is still probed below.
    probes = [p for p in probes if p != ("GET", "/dashboard/login")]
    assert ("POST", "/dashboard/login") in probes
    tenant = gateway.headers("team-a")
    import httpx2 as httpx

    with httpx.Client(timeout=10) as client:
        for method, path in probes:
            for headers in (tenant, {"x-api-key": gateway.key("team-a")}, {}):
                r = client.request(method, gateway.url + path, headers=headers, json={})
                assert r.status_code in (401, 403), (
                    method,
                    path,
                    headers.keys(),
                    r.status_code,
                    r.text[:200],
                )
            if (method, path) == ("POST", "/dashboard/login"):  # the sign-in form takes the key in its body
                # (a client of its own: the admin's session cookie must not reach later probes)
                forged = httpx.post(gateway.url + path, data={"key": gateway.key("team-a")})
                assert forged.status_code == 401 and "set-cookie" not in forged.headers, forged.status_code
                ok = httpx.post(gateway.url + path, data={"key": ADMIN_KEY})
            else:
                ok = client.request(
                    method, gateway.url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}
                )
            assert ok.status_code not in (401, 403), (method, path, "the admin key itself is refused")
            client.cookies.clear()  # the dashboard's session cookie the admin got must not reach the next probes


# ----------------------------------------------------------------------------- tenant isolation
def test_tenants_never_share_cache_entries_rows_or_spend(gateway: RunningGateway, mock: MockUpstream) -> None:
    body = chat("the same question from two tenants")
    a1 = gateway.post(CHAT, body, tenant="team-a")
    a2 = gateway.post(CHAT, body, tenant="team-a")
    assert (a1.headers["x-switchyard-cache"], a2.headers["x-switchyard-cache"]) == ("miss", "hit")
    mock.clear_requests()
    b1 = gateway.post(CHAT, body, tenant="team-b")
    assert b1.status_code == 200 and b1.headers["x-switchyard-cache"] == "miss"
    assert len(mock.requests()) == 1, "tenant B was answered from tenant A's cache entry"
    b2 = gateway.post(CHAT, body, tenant="team-b")
    assert b2.headers["x-switchyard-cache"] == "hit"
    # streaming replay obeys the same separation
    s = gateway.post(CHAT, {**body, "stream": True}, tenant="team-c")
    assert s.headers["x-switchyard-cache"] == "miss"

    rows = gateway.ledger_rows()
    by_key = {hash_key(gateway.key(t))[:12]: t for t in ("team-a", "team-b", "team-c")}
    assert len(rows) == 5
    for row in rows:
        assert by_key[row["key_id"]] == row["tenant"], "a row carries another tenant's key"
    assert [r["tenant"] for r in rows] == ["team-a", "team-a", "team-b", "team-b", "team-c"]
    # spend is attributed per tenant: B's miss is charged to B, A's hit costs A nothing
    cost = {(r["tenant"], r["cache_status"]): r["cost_usd"] for r in rows}
    assert cost[("team-b", "miss")] not in (None, "0E-10") and cost[("team-a", "hit")] in (
        "0E-10",
        "0",
        "0.0000000000",
    )
    metrics = gateway.get("/metrics").text
    spend_lines = [ln for ln in metrics.splitlines() if ln.startswith("switchyard_cost_usd_total{")]
    assert {ln.split('tenant="')[1].split('"')[0] for ln in spend_lines} == {"team-a", "team-b", "team-c"}
    # a tenant key reads no spend at all (the spend API is admin-only)
    for path in ("/admin/spend", "/admin/savings", "/admin/budgets"):
        assert gateway.get(path, headers=gateway.headers("team-b")).status_code in (401, 403, 404)


# ----------------------------------------------------------------------------- upstream steering
def test_clients_cannot_choose_the_upstream_or_its_credentials(
    gateway: RunningGateway, mock: MockUpstream
) -> None:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=4) as attacker:
        evil = attacker.base_url + "/v1"
        hijack = {
            "api_base": evil,
            "base_url": evil,
            "api_key": "sk-client-injected-key-0000",
            "custom_llm_provider": "openai",
            "extra_headers": {"authorization": "Bearer sk-client-injected-key-0000"},
            "headers": {"x-api-key": "sk-client-injected-key-0000"},
        }
        headers = {
            "x-api-key": "sk-client-injected-key-0000",
            "openai-organization": "org-evil",
            "openai-project": "proj-evil",
            "anthropic-version": "1999-01-01",
            "x-forwarded-host": attacker.base_url.removeprefix("http://"),
            "x-evil-header": "1",
        }
        for route in ("auto", "anthropic-first"):
            r = gateway.post(CHAT, {**chat(f"steer {route}"), **hijack}, headers=headers)
            assert r.status_code == 200, r.text
        assert attacker.requests() == [], "a client steered the gateway to its own upstream"
    upstream = [r for r in mock.requests() if not r["path"].startswith("/_mock")]
    assert len(upstream) == 2
    for req in upstream:
        hdrs = {k.lower(): v for k, v in req["headers"].items()}
        blob = repr(hdrs)
        assert "sk-client-injected" not in blob and "org-evil" not in blob and "proj-evil" not in blob
        assert "x-evil-header" not in hdrs and "x-forwarded-host" not in hdrs
        assert "1999-01-01" not in blob
        assert gateway.key("team-a") not in blob
        if req["path"] == "/v1/chat/completions":
            assert hdrs["authorization"] == f"Bearer {OPENAI_CANARY}"
        else:
            assert hdrs["x-api-key"] == "sk-ant-canary-0123456789abcdef"


# ----------------------------------------------------------------------------- prompt logging
@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    for name in ("", "switchyard", "switchyard.prompts", "uvicorn", "uvicorn.error", "uvicorn.access"):
        caplog.set_level(logging.DEBUG, logger=name)
    for name in ("uvicorn", "uvicorn.access"):
        logging.getLogger(name).addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for name in ("uvicorn", "uvicorn.access"):
            logging.getLogger(name).removeHandler(caplog.handler)


def _traffic(gw: RunningGateway, marker: str) -> None:
    assert gw.post(CHAT, chat(f"{marker} plain")).status_code == 200
    assert gw.post(CHAT, chat(f"{marker} stream", stream=True)).status_code == 200
    assert gw.post(CHAT, chat(f"{marker} bad", temperature=9)).status_code == 400


@pytest.mark.parametrize("opt_in", [False, True])
def test_prompts_are_logged_only_when_the_policy_opts_in(
    tmp_path: Path, mock: MockUpstream, all_logs: pytest.LogCaptureFixture, opt_in: bool
) -> None:
    extra = "server:\n  log_prompts: true\n" if opt_in else ""
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra))
    try:
        _traffic(gw, "PROMPT-MARKER-7f3a")
    finally:
        gw.stop()
    assert all_logs.records, "no log records captured"
    text = "\n".join(rec.getMessage() for rec in all_logs.records)
    if not opt_in:
        assert "PROMPT-MARKER-7f3a" not in text, "a prompt or completion reached the logs"
        return
    prompt_lines = [r.getMessage() for r in all_logs.records if r.name == "switchyard.prompts"]
    assert len(prompt_lines) == 2  # the plain and the streamed request, not the refused one
    assert all("echo: PROMPT-MARKER-7f3a" in line for line in prompt_lines), "the completion is logged"
    assert OPENAI_CANARY not in text
