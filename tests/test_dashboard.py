"""/dashboard: admin key required; in headless Chromium (Debian `chromium`, driven by
Playwright) after real traffic, the four charts render as SVG with the ledger's data."""

from __future__ import annotations

import base64
import logging
import shutil
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.api.auth import SESSION_TTL_S, session_token
from gateway.config.settings import Secret
from tests.conftest import require_module
from tests.gateway_harness import ADMIN_KEY, RunningGateway

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HELLO = [{"role": "user", "content": "hello there"}]
IN_CI = __import__("os").environ.get("CI", "").lower() in ("1", "true", "yes")


def test_dashboard_needs_the_admin_key(gateway: RunningGateway) -> None:
    page = gateway.get("/dashboard")
    assert page.status_code == 401
    assert page.headers["www-authenticate"].startswith("Basic ")
    assert gateway.get("/dashboard", headers=gateway.headers("team-a")).status_code == 401
    assert gateway.get("/dashboard/dashboard.js").status_code == 401
    token = base64.b64encode(f"admin:{ADMIN_KEY}".encode()).decode()
    ok = gateway.get("/dashboard", headers={"authorization": f"Basic {token}"})
    assert ok.status_code == 200 and "<svg" not in ok.text and "dashboard.js" in ok.text
    assert "http://" not in ok.text.replace("http://www.w3.org", "") and "https://" not in ok.text  # no CDN
    js = gateway.get("/dashboard/dashboard.js", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert (
        gateway.get("/dashboard/secrets.txt", headers={"authorization": f"Bearer {ADMIN_KEY}"}).status_code
        == 404
    )


SECRET_USER = "user-secret-4242"  # names a conversation; must never reach the ledger
SYSTEM = [
    {"type": "text", "text": "You are a careful assistant. " * 40, "cache_control": {"type": "ephemeral"}}
]


SCORES = {"team-a": 1.0, "team-b": 0.25, "team-c": 0.5}  # the feedback each tenant gives


def _traffic(gw: RunningGateway) -> dict[str, float]:
    """The requests, and feedback on the first of each pair: {request id: score}."""
    rated: dict[str, float] = {}
    for tenant, model in (("team-a", "auto"), ("team-a", "large"), ("team-b", "auto"), ("team-c", "claude")):
        body = {"model": model, "messages": HELLO, "temperature": 0}
        for i in range(2):  # the second identical request is an exact-cache hit (a saving)
            r = gw.post("/v1/chat/completions", body, tenant=tenant)
            assert r.status_code == 200, r.text
            if i == 0:
                rid = r.headers["x-request-id"]
                fb = gw.post("/v1/feedback", {"request_id": rid, "score": SCORES[tenant]}, tenant=tenant)
                assert fb.status_code == 200, fb.text
                rated[rid] = SCORES[tenant]
    # an agent's conversation on /v1/messages: a cached system prompt, read back from turn 2 on
    for user, turns in ((SECRET_USER, 3), ("other-user", 1)):
        for turn in range(turns):
            body = {
                "model": "claude",
                "max_tokens": 32,
                "system": SYSTEM,
                "metadata": {"user_id": user},
                "messages": [{"role": "user", "content": f"turn {turn} of {user}"}],
            }
            r = gw.post("/v1/messages", body, tenant="team-a", headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 200, r.text
    return rated


def test_dashboard_renders_charts_in_headless_chromium(
    gateway: RunningGateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("chromium is required under CI=true (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    sync_api = require_module("playwright.sync_api")
    rated = _traffic(gateway)
    rows = gateway.ledger_rows()
    by_model: dict[str, Decimal] = {}
    for r in rows:
        if r["served_model"] and r["cost_usd"]:
            by_model[r["served_model"]] = by_model.get(r["served_model"], Decimal(0)) + Decimal(r["cost_usd"])
    shot = tmp_path / "dashboard.png"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(
                http_credentials={"username": "admin", "password": ADMIN_KEY},
                viewport={"width": 1280, "height": 1000},
            )
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(gateway.url + "/dashboard")
            page.wait_for_selector("body[data-ready]", timeout=15000)
            assert page.get_attribute("body", "data-ready") == "true", page.inner_text("#status")
            conversations = page.eval_on_selector_all(
                "#conversations tr[data-conversation]",
                """els => els.map(r => [r.dataset.conversation, Number(r.dataset.cost),
                     Number(r.dataset.cachedShare), r.cells[4].textContent])""",
            )
            tasks = page.eval_on_selector_all(
                "#tasks tr[data-task]", "els => els.map(r => [r.dataset.task, r.dataset.quality])"
            )
            charts = page.eval_on_selector_all(
                "svg[data-chart]",
                """els => Object.fromEntries(els.map(s => [s.dataset.chart,
                     [...s.querySelectorAll('rect[data-label]')].map(r =>
                        [r.dataset.label, Number(r.dataset.value), Number(r.getAttribute('width')),
                         Number(r.getAttribute('height'))])]))""",
            )
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    with capsys.disabled():
        print(f"\ndashboard screenshot: {shot}")
    assert errors == []
    assert set(charts) == {
        "spend-time", "spend-model", "spend-tenant", "savings-cause", "cached-route", "quality-model"
    }  # fmt: skip
    # feedback quality by model and by task: the mean score of each one's rated requests
    scores: dict[str, list[float]] = {}
    by_task: dict[str, list[float]] = {}
    for r in rows:
        if r["request_id"] in rated:
            scores.setdefault(r["served_model"], []).append(rated[r["request_id"]])
            by_task.setdefault(r["task"], []).append(rated[r["request_id"]])
    quality = {label: value for label, value, _, _ in charts["quality-model"]}
    assert quality == pytest.approx({m: sum(v) / len(v) for m, v in scores.items()})
    assert len(set(quality.values())) > 1  # the tenants' different scores show
    shown = {t: float(q) for t, q in tasks if q}
    assert shown == pytest.approx({t: sum(v) / len(v) for t, v in by_task.items()})
    # cached share by route and the top conversations: the ledger rows' own numbers
    assert all(SECRET_USER not in str(v) for r in rows for v in r.values())
    tokens: dict[str, list[int]] = {}
    convs: dict[str, list[Decimal]] = {}
    for r in rows:
        if r["route"] and r["input_tokens"]:
            t = tokens.setdefault(r["route"], [0, 0])
            t[0] += r["cached_tokens"] or 0
            t[1] += r["input_tokens"]
        if r["conversation"]:
            c = convs.setdefault(r["conversation"], [Decimal(0), Decimal(0), Decimal(0)])
            c[0] += Decimal(r["cost_usd"] or 0)
            c[1] += r["cached_tokens"] or 0
            c[2] += r["input_tokens"] or 0
    shares = {label: value for label, value, _, _ in charts["cached-route"]}
    assert shares == pytest.approx({route: c / n for route, (c, n) in tokens.items()})
    assert any(v > 0 for v in shares.values())  # the conversation's later turns read the cache
    assert {c for c, *_ in conversations} == set(convs)
    assert all(len(c) == 16 and int(c, 16) >= 0 for c in convs)
    assert [c for c, *_ in conversations] == sorted(convs, key=lambda c: -convs[c][0])
    for conv, cost, share, text in conversations:
        assert cost == pytest.approx(float(convs[conv][0]), rel=1e-9)
        assert share == pytest.approx(float(convs[conv][1] / convs[conv][2]))
        assert text.endswith("%")
    assert max(share for _, _, share, _ in conversations) > 0.5
    models = {label: value for label, value, _, _ in charts["spend-model"]}
    assert set(models) - {"(cache)"} == set(by_model)
    for model, cost in by_model.items():
        assert models[model] == pytest.approx(float(cost), rel=1e-9)
    assert {label for label, *_ in charts["spend-tenant"]} == {"team-a", "team-b", "team-c"}
    assert "exact_cache" in {label for label, *_ in charts["savings-cause"]}
    assert len(charts["spend-time"]) >= 1 and charts["spend-time"][0][1] > 0
    # bars were drawn with a size, not just placed in the DOM
    assert all(w > 0 for chart in charts.values() for _, _, w, _ in chart)
    assert shot.stat().st_size > 10_000


def test_admin_spend_by_conversation_with_a_limit(gateway: RunningGateway) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    for user in ("u-one", "u-two", "u-two"):
        body = {
            "model": "claude",
            "max_tokens": 16,
            "system": SYSTEM,
            "metadata": {"user_id": user},
            "messages": [{"role": "user", "content": f"hello from {user}"}],
        }
        r = gateway.post("/v1/messages", body, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200, r.text
    gateway.ledger_rows()  # flushed
    both = gateway.get("/admin/spend?group_by=conversation&bucket=none", headers=admin)
    assert both.status_code == 200, both.text
    assert sorted(r["requests"] for r in both.json()["spend"]) == [1, 2]
    one = gateway.get("/admin/spend?group_by=conversation&bucket=none&limit=1", headers=admin).json()
    (top,) = one["spend"]
    assert top["group"] in {r["group"] for r in both.json()["spend"]} and len(top["group"]) == 16
    for bad in ("0", "abc", "100000"):
        r = gateway.get(f"/admin/spend?group_by=conversation&limit={bad}", headers=admin)
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


# --------------------------------------------------------------------------- signing in
def _chromium_or_skip() -> Any:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("chromium is required under CI=true (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return require_module("playwright.sync_api")


def _ledger_totals(gw: RunningGateway) -> tuple[Decimal, int]:
    rows = gw.ledger_rows()
    return sum((Decimal(r["cost_usd"]) for r in rows if r["cost_usd"]), Decimal(0)), len(rows)


def _totals_on(page: Any) -> dict[str, str]:
    page.wait_for_selector("body[data-ready]", timeout=15000)
    assert page.get_attribute("body", "data-ready") == "true", page.inner_text("#status")
    boxes = page.eval_on_selector_all(
        "#totals div", "els => els.map(d => [d.lastChild.textContent, d.querySelector('b').textContent])"
    )
    return dict(boxes)


def _usd(value: Decimal) -> str:  # the page's own rounding (dashboard.js usd())
    if value == 0:
        return "$0"
    if abs(value) >= Decimal("0.01"):
        return f"${value:,.2f}"
    digits = f"{value:.3g}"  # three significant digits, written out without an exponent
    return "$" + format(Decimal(digits), "f")


def test_sign_in_form_in_headless_chromium(gateway: RunningGateway, caplog: pytest.LogCaptureFixture) -> None:
    """No key in the URL: the sign-in form; a wrong key says so; the right one shows the
    ledger's numbers; the key never reaches a log record, the cookie or the page."""
    sync_api = _chromium_or_skip()
    caplog.set_level(logging.DEBUG)
    _traffic(gateway)
    spent, requests = _ledger_totals(gateway)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context()
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(gateway.url + "/dashboard/login")  # /dashboard itself challenges (Basic)
            page.wait_for_selector("form#login")
            page.fill("#key", "sy-admin-wrong-key")
            page.click("button[type=submit]")
            page.wait_for_selector("form#login")
            assert page.inner_text("#error") == "That is not the admin key."
            assert context.cookies() == []
            page.fill("#key", ADMIN_KEY)
            page.click("button[type=submit]")
            page.wait_for_url(gateway.url + "/dashboard")
            totals = _totals_on(page)
            (cookie,) = context.cookies()
            html = page.content()
        finally:
            browser.close()
    assert errors == []
    assert totals == {"spend": _usd(spent), "saved": totals["saved"], "requests": str(requests)}
    assert cookie["name"] == "sy_admin_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_KEY not in cookie["value"] and ADMIN_KEY not in html
    assert caplog.records and ADMIN_KEY not in caplog.text


def test_key_in_the_url_works_in_headless_chromium(gateway: RunningGateway) -> None:
    """http://admin:KEY@host/dashboard: the panels fill (fetch refuses URLs with credentials,
    so the page calls the API on its origin with the session cookie)."""
    sync_api = _chromium_or_skip()
    _traffic(gateway)
    spent, requests = _ledger_totals(gateway)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context().new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://admin:{ADMIN_KEY}@127.0.0.1:{gateway.port}/dashboard")
            totals = _totals_on(page)
        finally:
            browser.close()
    assert errors == []
    assert totals["spend"] == _usd(spent) and totals["requests"] == str(requests)


def test_session_cookie_opens_the_admin_api_and_nothing_else(gateway: RunningGateway) -> None:
    r = gateway.post(
        "/dashboard/login", f"key={ADMIN_KEY}", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    set_cookie = r.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Path=/" in set_cookie
    token = r.cookies["sy_admin_session"]
    assert ADMIN_KEY not in token
    cookie = {"cookie": f"sy_admin_session={token}"}
    assert gateway.get("/admin/spend", headers=cookie).status_code == 200
    assert gateway.get("/dashboard/dashboard.js", headers=cookie).status_code == 200
    forged = token.rpartition(".")[0] + "." + "0" * 64
    assert gateway.get("/admin/spend", headers={"cookie": f"sy_admin_session={forged}"}).status_code == 401
    expired = session_token(Secret(ADMIN_KEY), now=time.time() - 2 * SESSION_TTL_S)
    assert gateway.get("/admin/spend", headers={"cookie": f"sy_admin_session={expired}"}).status_code == 401
    other = session_token(Secret("another-admin-key-0123456789"))
    assert gateway.get("/admin/spend", headers={"cookie": f"sy_admin_session={other}"}).status_code == 401
    # a virtual key is no way in, and a wrong form key sets nothing
    wrong = gateway.post(
        "/dashboard/login", "key=nope", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    assert "That is not the admin key." in wrong.text


def test_sign_in_page_without_a_key(gateway: RunningGateway) -> None:
    page = gateway.get("/dashboard")
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert 'action="/dashboard/login"' in page.text and 'name="key"' in page.text
    assert page.headers["www-authenticate"].startswith("Basic ")  # URL credentials, the browser prompt
    form = gateway.get("/dashboard/login")
    assert form.status_code == 200 and "www-authenticate" not in form.headers and 'name="key"' in form.text
    assert gateway.get("/dashboard/login.css").status_code == 200  # styled before signing in


def test_favicon_is_served_to_anyone(gateway: RunningGateway) -> None:
    icon = gateway.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg") and gateway.get("/dashboard/favicon.svg").status_code == 200


def test_selects_apply_on_change_and_amounts_read_as_currency(gateway: RunningGateway) -> None:
    """Choosing a window or a bucket reloads the panels with no Refresh click; amounts are
    currency ($1,234.50, $0.000000100), never an exponent; the page's icon loads (no 404)."""
    sync_api = _chromium_or_skip()
    _traffic(gateway)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(http_credentials={"username": "admin", "password": ADMIN_KEY})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            failed: list[str] = []
            page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
            page.goto(gateway.url + "/dashboard")
            page.wait_for_selector("body[data-ready]", timeout=15000)
            with page.expect_request(lambda r: "since=7d" in r.url, timeout=15000):
                page.select_option("#since", "7d")
            with page.expect_request(lambda r: "bucket=hour" in r.url, timeout=15000):
                page.select_option("#bucket", "hour")
            page.wait_for_function(
                "() => document.getElementById('status').textContent.startsWith('updated')"
            )
            formatted = page.evaluate("() => [usd(1e-7), usd(0.004567), usd(1234.5), usd(0), usd('0.0100')]")
            totals = page.inner_text("#totals")
            icon = page.evaluate("() => fetch('/favicon.ico').then(r => r.status)")
        finally:
            browser.close()
    assert errors == [] and failed == [] and icon == 200
    assert formatted == ["$0.000000100", "$0.00457", "$1,234.50", "$0", "$0.01"]
    assert "e-" not in totals and "$" in totals
