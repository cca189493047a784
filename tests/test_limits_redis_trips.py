"""Redis-mode limits cost one awaited round trip per request: the rate limits (rpm, tpm) and the
budget reservation go in one script at admission, the tokens-per-minute debit and the budget
settlement in one more after the call (off the response's path). Counted with MONITOR on a
real Redis, through a real gateway; the counters must still add up to the ledger."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.limits.budgets import period_bounds, to_nanos
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway
from tests.limits_helpers import REDIS_URL, redis_prefix, unique

pytestmark = pytest.mark.redis


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix("sytest-trips") as p:
        yield p


class Monitor:
    """Commands clients send on keys under ``prefix`` (not those a script runs inside)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.commands: list[str] = []
        self._client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._client.monitor() as mon:
            self._ready.set()
            for cmd in mon.listen():
                if self._stop.is_set():
                    return
                if cmd.get("client_type") != "lua" and self.prefix in cmd.get("command", ""):
                    self.commands.append(cmd["command"].split()[0].upper())

    def __enter__(self) -> Monitor:
        self._thread.start()
        assert self._ready.wait(5)
        # what the previous requests settle in the background lands first (a loaded machine
        # can take seconds): count from the first 0.3 s without a command
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen = len(self.commands)
            time.sleep(0.3)
            if len(self.commands) == seen:
                break
        self.commands.clear()
        return self

    def wait_for(self, n: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.commands) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # anything more would show up now
        return list(self.commands)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        redis.Redis.from_url(REDIS_URL).ping()  # one more command wakes the listener
        self._thread.join(5)
        self._client.close()


def test_a_metered_request_costs_one_admission_and_one_settlement(
    tmp_path: Path, mock: MockUpstream, prefix: str
) -> None:
    tenant = unique("trips")
    limits = f"limits: {{redis_url: '{REDIS_URL}', redis_prefix: '{prefix}', redis_timeout_s: 2, "
    limits += "key_rpm: 100000, key_tpm: 600}\n"
    text = mock_policy(mock.base_url, limits)
    text = text.replace("routes:\n", "routes:\n  metered:\n    targets: [small]\n", 1)
    text = text.replace(
        "tenants:\n", f"tenants:\n  {tenant}:\n    rpm: 100000\n    budget: {{daily_usd: 5}}\n", 1
    )
    gw = start_gateway(tmp_path, text)
    try:

        def ask(text: str) -> None:
            body = {
                "model": "metered",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 8,
                "temperature": 0,
            }
            r = gw.post("/v1/chat/completions", body, tenant=tenant)
            assert r.status_code == 200, r.text

        ask("warm up: scripts loaded")
        time.sleep(0.5)
        counts = {"requests": 1, "hits": 0}

        def trips(send: Any, want: int) -> None:
            """``send()`` costs exactly ``want`` commands. Up to three tries: a command landing
            in the window from outside this request (a background settlement the machine's load
            delayed past the quiet period) must not fail it; a request that really costs more
            fails every try."""
            seen: list[list[str]] = []
            for attempt in range(3):
                with Monitor(prefix) as mon:
                    send(attempt)
                    sent = mon.wait_for(want)
                if sent == ["EVALSHA"] * want:
                    return
                seen.append(sent)
            raise AssertionError(f"expected {want} EVALSHA per try, saw {seen}")

        def three_misses(attempt: int) -> None:
            for i in range(3):
                ask(f"question {attempt}-{i}")
            counts["requests"] += 3

        def one_hit(attempt: int) -> None:
            ask("question 0-0")  # an exact-cache hit: admitted (its reservation given back)
            counts["requests"] += 1
            counts["hits"] += 1

        trips(three_misses, 6)  # admission + settlement, per request
        trips(one_hit, 2)
        # the agents' surfaces too: Anthropic Messages and OpenAI Responses admit and reserve
        # in one round trip (they took two, rate limits then reservation, before)
        for path in ("/v1/messages", "/v1/responses"):

            def agent(attempt: int, path: str = path) -> None:
                if path == "/v1/messages":
                    body = {"model": "metered", "max_tokens": 8, "messages": [{"role": "user", "content": f"hi A{attempt}"}]}  # fmt: skip
                else:
                    body = {
                        "model": "metered",
                        "input": f"hi R{attempt}",
                        "max_output_tokens": 16,
                        "store": False,
                    }
                r = gw.post(path, body, tenant=tenant)
                assert r.status_code == 200, (path, r.text)
                counts["requests"] += 1

            trips(agent, 2)
    finally:
        gw.stop()
    import sqlite3

    conn = sqlite3.connect(gw.settings.home / "ledger.db")
    try:
        rows = conn.execute(
            "SELECT cost_usd, cache_status FROM ledger WHERE tenant = ? ORDER BY ts", (tenant,)
        ).fetchall()
    finally:
        conn.close()
    assert [r[1] for r in rows].count("hit") == counts["hits"] and len(rows) == counts["requests"]
    spent = sum(to_nanos(Decimal(str(r[0]))) for r in rows if r[1] != "hit")
    assert spent > 0
    client = redis.Redis.from_url(REDIS_URL)
    counter = client.get(f"{prefix}budget:tenant:{tenant}:day:" + period_bounds("day", time.time())[0])
    assert counter is not None and int(counter) == spent  # reservations settled to the cent
    key_id = next(k for k in (x.decode() for x in client.scan_iter(match=f"{prefix}rl:tpm:key:*")))
    tokens = float(client.hget(key_id, "t") or 0)
    assert tokens < 600  # the tokens-per-minute bucket was debited


@pytest.mark.parametrize("limited", [True, False], ids=["with-limits", "without-limits"])
def test_stickiness_rides_on_the_limits_scripts(
    tmp_path: Path, mock: MockUpstream, prefix: str, limited: bool
) -> None:
    """With Redis, where a conversation lives is shared. With limits, its read rides on the
    admission script and its write (a new or changed model) on the settlement script: a
    conversation request costs the limits' two scripts and nothing more, like any request.
    Without limits (no script to ride on) a conversation request costs one GETEX, and one SET
    when its model is new; a request that is not a conversation costs nothing."""
    tenant = unique("sticky")
    rates = ", key_rpm: 100000" if limited else ""
    limits = f"limits: {{redis_url: '{REDIS_URL}', redis_prefix: '{prefix}', redis_timeout_s: 2{rates}}}\n"
    text = mock_policy(mock.base_url, limits).replace(
        "routes:\n", "routes:\n  metered:\n    targets: [small]\n", 1
    )
    if limited:
        text = text.replace("tenants:\n", f"tenants:\n  {tenant}:\n    budget: {{daily_usd: 5}}\n", 1)
    gw = start_gateway(tmp_path, text)
    scripts = ["EVALSHA"] * 2 if limited else []
    system = {"role": "system", "content": "You are terse."}

    def ask(messages: list[dict[str, str]]) -> None:
        body = {"model": "metered", "messages": messages, "max_tokens": 8}
        r = gw.post("/v1/chat/completions", body, tenant=tenant)
        assert r.status_code == 200, r.text

    def costs(send: Any, want: list[str]) -> None:
        seen: list[list[str]] = []
        for attempt in range(3):  # as above: a stray background command gets another try
            with Monitor(prefix) as mon:
                send(attempt)
                sent = sorted(mon.wait_for(len(want)))
            if sent == sorted(want):
                return
            seen.append(sent)
        raise AssertionError(f"expected {sorted(want)}, saw {seen}")

    try:
        ask([{"role": "user", "content": "warm up"}])
        time.sleep(0.5)
        costs(lambda a: ask([{"role": "user", "content": f"one message {a}"}]), scripts)
        first = {"role": "user", "content": "conversation"}

        def new_conversation(a: int) -> None:
            ask([system, {**first, "content": f"conversation {a}"}])

        costs(new_conversation, scripts if limited else ["GETEX", "SET"])

        def next_turn(a: int) -> None:
            turn = [system, {**first, "content": "conversation 0"}, {"role": "assistant", "content": "ok"}]
            ask([*turn, {"role": "user", "content": f"and then {a}"}])

        costs(next_turn, scripts if limited else ["GETEX"])  # same model: no write
        client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        stored = [client.get(k) for k in client.scan_iter(match=f"{prefix}sticky:*")]
        assert stored and set(stored) == {"small"}, stored  # written, by a script or by SET
    finally:
        gw.stop()
