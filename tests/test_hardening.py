"""Hostile clients and lying upstreams, through a real gateway (issue 14): every path out of a
request settles or releases its reservation and leaves its row; the worst case reserved
counts every answer (``n``); one JSON depth limit at the door; strict sampling types; a
client that leaves a stream stops the upstream; ``deadline_s`` cuts a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from load_tests.lying_upstream import (
    Json,
    LyingUpstream,
    answer_of,
    chat_body,
    chunk,
    healthz_while,
    lying_policy,
    nested,
    stalled_bodies,
)
from tests.gateway_harness import ADMIN_KEY, RunningGateway, start_gateway

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def liar() -> Iterator[LyingUpstream]:
    with LyingUpstream() as upstream:
        yield upstream


@pytest.fixture
def lgw(tmp_path: Path, liar: LyingUpstream) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path, lying_policy(liar.base_url))
    try:
        yield gw
    finally:
        gw.stop()


def spent(gw: RunningGateway, tenant: str = "capped") -> Decimal:
    r = gw.get("/admin/budgets", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    row = next(
        x
        for x in r.json()["budgets"]
        if x["scope"] == "tenant" and x["name"] == tenant and x["period"] == "day"
    )
    return Decimal(row["spent_usd"])


def sse_events(text: str) -> list[str]:
    return [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]


# ----------------------------------------------------------------- class 2: no leaked budget
def test_an_unexpected_error_releases_the_reservation_and_leaves_a_row(
    lgw: RunningGateway, liar: LyingUpstream
) -> None:
    # An upstream answer nested 300 levels parses but cannot be written back: a bug-shaped
    # failure inside the gateway (not a SwitchyardError).
    liar.json = chat_body(usage={"prompt_tokens": 3, "completion_tokens": 1}, extra=nested(300))
    for _ in range(5):
        r = lgw.post(CHAT, {"model": "lie", "messages": HELLO, "max_tokens": 8}, tenant="capped")
        assert r.status_code == 500, r.text
        assert r.json()["error"]["code"] == "internal_error"
        assert "Traceback" not in r.text
    rows = [x for x in lgw.ledger_rows() if x["tenant"] == "capped"]
    assert len(rows) == 5
    assert {(x["status"], x["http_status"]) for x in rows} == {("error", 500)}
    # every reservation settled to what the upstream billed (3 + 1 tokens), as the rows say:
    # nothing left reserved, no drift between the budget and the ledger
    assert spent(lgw) == sum(Decimal(str(x["cost_usd"])) for x in rows) == 5 * Decimal("0.000005")


def test_an_unexpected_error_mid_stream_ends_with_an_error_event(
    lgw: RunningGateway, liar: LyingUpstream
) -> None:
    def events() -> Iterator[Json]:
        yield chunk("hi")
        bad = chunk(" there")
        bad["x"] = nested(300)
        yield bad
        yield chunk(None, {"prompt_tokens": 3, "completion_tokens": 2})

    liar.events = events
    body = {"model": "lie", "messages": HELLO, "max_tokens": 8, "stream": True}
    r = lgw.post(CHAT, body, tenant="capped")
    events_out = sse_events(r.text)
    assert events_out[-1] != "[DONE]" and "internal_error" in events_out[-1], events_out
    row = next(x for x in lgw.ledger_rows() if x["tenant"] == "capped")
    assert (row["status"], row["http_status"]) == ("stream_broken", 500)
    assert spent(lgw) == Decimal(str(row["cost_usd"] or 0))  # settled to what was served


# ----------------------------------------------------------------- class 3: n multiplies output
def test_the_worst_case_reserved_counts_every_choice(tmp_path: Path, liar: LyingUpstream) -> None:
    # 0.001 USD: one answer of 100 tokens at 2 USD/1M (0.0002) fits; eight (0.0016) do not.
    policy = lying_policy(liar.base_url).replace("daily_usd: 1}", "daily_usd: 0.001}")
    gw = start_gateway(tmp_path, policy)
    try:
        one = gw.post(CHAT, {"model": "lie", "messages": HELLO, "max_tokens": 100}, tenant="capped")
        assert one.status_code == 200, one.text
        eight = gw.post(CHAT, {"model": "lie", "messages": HELLO, "max_tokens": 100, "n": 8}, tenant="capped")
        assert eight.status_code == 429, eight.text
        assert eight.json()["error"]["code"] == "budget_exceeded"
        # the route default counts too: 64 tokens x 8 choices = 0.001024 USD > 0.001
        dflt = gw.post(CHAT, {"model": "lie", "messages": HELLO, "n": 8}, tenant="capped")
        assert dflt.status_code == 429, dflt.text
    finally:
        gw.stop()


def test_concurrent_n_requests_stay_within_the_budget_plus_one_worst_case(
    tmp_path: Path, liar: LyingUpstream
) -> None:
    # every answer bills all 8 x 16 output tokens the client allowed
    liar.json = chat_body(usage={"prompt_tokens": 10, "completion_tokens": 128})
    policy = lying_policy(liar.base_url).replace("daily_usd: 1}", "daily_usd: 0.002}")
    gw = start_gateway(tmp_path, policy)
    try:
        body = {"model": "lie", "messages": HELLO, "max_tokens": 16, "n": 8}
        key = gw.key("capped")

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                headers = {"authorization": f"Bearer {key}"}
                return list(
                    await asyncio.gather(
                        *(client.post(gw.url + CHAT, json=body, headers=headers) for _ in range(60))
                    )
                )

        codes = {r.status_code for r in asyncio.run(fire())}
        assert codes <= {200, 429}, codes
        gw.app_state.services.ledger.flush(5.0)
        total = sum(Decimal(str(x["cost_usd"] or 0)) for x in gw.ledger_rows())
        worst = Decimal("0.000001") * 200 + Decimal("0.000002") * 128  # a generous prompt bound
        assert total <= Decimal("0.002") + worst, total
    finally:
        gw.stop()


# ----------------------------------------------------------------- class 4: JSON depth at the door
@pytest.mark.parametrize("depth", [65, 300, 1000, 5000])
def test_deep_json_is_refused_at_the_door(lgw: RunningGateway, liar: LyingUpstream, depth: int) -> None:
    raw = '{"model": "lie", "messages": [{"role": "user", "content": "hi"}], "metadata": '
    raw += "[" * depth + "1" + "]" * depth + "}"
    r = lgw.post(CHAT, raw, tenant="capped", headers={"content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "deeper than 64 levels" in r.json()["error"]["message"]
    assert liar.requests == []
    assert spent(lgw) == 0


def test_json_at_the_depth_limit_passes(lgw: RunningGateway, liar: LyingUpstream) -> None:
    body = {"model": "lie", "messages": HELLO, "metadata": nested(60)}
    r = lgw.post(CHAT, body, tenant="capped")
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------- class 12: strict sampling types
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", True),
        ("temperature", "0.5"),
        ("top_p", "1"),
        ("presence_penalty", False),
        ("frequency_penalty", "0"),
        ("logit_bias", {"42": True}),
    ],
)
def test_loose_sampling_types_are_refused_naming_the_field(
    lgw: RunningGateway, liar: LyingUpstream, field: str, value: object
) -> None:
    r = lgw.post(CHAT, {"model": "lie", "messages": HELLO, field: value}, tenant="capped")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].split(".")[0] == field and field in err["message"]
    assert liar.requests == []


def test_integer_sampling_values_still_pass(lgw: RunningGateway, liar: LyingUpstream) -> None:
    body = {"model": "lie", "messages": HELLO, "temperature": 1, "top_p": 1, "presence_penalty": 0}
    r = lgw.post(CHAT, body, tenant="capped")
    assert r.status_code == 200, r.text


# ----------------------------------------------------------------- classes 1 and 11: streams
def test_a_client_that_leaves_a_fast_stream_stops_the_upstream(
    lgw: RunningGateway, liar: LyingUpstream
) -> None:
    total = 200_000
    piece = "x" * 100

    def events() -> Iterator[Json]:
        for _ in range(total):
            yield chunk(piece)

    liar.events, liar.batch = events, 500
    body = {"model": "lie", "messages": HELLO, "max_tokens": 8, "stream": True}
    read = 0
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", lgw.url + CHAT, json=body, headers=lgw.headers("capped")) as r,
    ):
        for part in r.iter_bytes():
            read += len(part)
            if read > 64 * 1024:
                break
    left = time.monotonic()
    while time.monotonic() - left < 10:
        rows = [x for x in lgw.ledger_rows() if x["tenant"] == "capped"]
        if rows:
            break
        time.sleep(0.05)
    stopped = time.monotonic() - left
    assert rows and (rows[0]["status"], rows[0]["http_status"]) == ("client_disconnected", 499), rows
    time.sleep(0.5)
    print(
        f"stream stopped {stopped * 1000:.0f} ms after the client left; upstream wrote {liar.written} of {total}"
    )
    assert liar.finished == 0 and liar.written < total // 2, liar.written
    assert stopped < 2.0, stopped
    t0 = time.monotonic()
    assert lgw.get("/healthz").status_code == 200
    assert time.monotonic() - t0 < 0.5


def test_deadline_cuts_a_drip_stream(tmp_path: Path, liar: LyingUpstream) -> None:
    liar.delay_s = 0.2

    def events() -> Iterator[Json]:
        for _ in range(40):  # 8 s of drip
            yield chunk("x")
        yield chunk(None, {"prompt_tokens": 3, "completion_tokens": 40})

    liar.events = events
    policy = lying_policy(liar.base_url).replace("retries: 0\n", "retries: 0\n    deadline_s: 1.5\n", 1)
    gw = start_gateway(tmp_path, policy)
    try:
        t0 = time.monotonic()
        r = gw.post(CHAT, {"model": "lie", "messages": HELLO, "stream": True}, tenant="capped")
        took = time.monotonic() - t0
        events_out = sse_events(r.text)
        assert events_out[-1] != "[DONE]" and "deadline" in events_out[-1], events_out[-3:]
        assert took < 3.0, took
        row = next(x for x in gw.ledger_rows() if x["tenant"] == "capped")
        assert row["status"] == "stream_broken"
    finally:
        gw.stop()


# ----------------------------------------------------------------- class 7: slow bodies
def test_slow_bodies_do_not_hold_admission_slots_and_time_out(tmp_path: Path, liar: LyingUpstream) -> None:
    extra = "server: {max_in_flight: 8, body_timeout_s: 2}\n"
    gw = start_gateway(tmp_path, lying_policy(liar.base_url, extra))
    body = {"model": "lie", "messages": HELLO}
    assert gw.post(CHAT, body, tenant="capped").status_code == 200  # warm (first-call costs)
    socks = stalled_bodies(gw.port, gw.key("capped"), 32)  # 4x the in-flight bound, never finished
    try:
        time.sleep(0.3)
        opened = time.monotonic()
        for _ in range(3):  # served: reading a body does not take an in-flight slot
            r = gw.post(CHAT, body, tenant="capped")
            assert r.status_code == 200, r.text
        for s in socks:  # ... while every slow body was still held open (not cut yet)
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
            s.settimeout(10)
        for s in socks:  # and the slow bodies are cut after body_timeout_s
            answer = answer_of(s)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
            assert b"request_timeout" in answer
        assert 1.5 < time.monotonic() - opened < 5.0
        gate = gw.server.config.app
        assert (gate.reading, gate.in_flight) == (0, 0)
    finally:
        for s in socks:
            s.close()
        gw.stop()


def test_body_reads_have_their_own_bound(tmp_path: Path, liar: LyingUpstream) -> None:
    extra = "server: {max_in_flight: 8, max_body_reads: 4, body_timeout_s: 2}\n"
    gw = start_gateway(tmp_path, lying_policy(liar.base_url, extra))
    socks = stalled_bodies(gw.port, gw.key("capped"), 4)
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        r = gw.post(CHAT, {"model": "lie", "messages": HELLO}, tenant="capped")
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
        assert r.headers["retry-after"] == "1" and time.monotonic() - t0 < 1.0
        assert gw.get("/v1/models", headers=gw.headers("capped")).status_code == 200  # no body: served
        assert 'switchyard_load_shed_total{reason="body_reads"} 1.0' in gw.get("/metrics").text
        for s in socks:
            assert answer_of(s).startswith(b"HTTP/1.1 408")
        r = gw.post(CHAT, {"model": "lie", "messages": HELLO}, tenant="capped")
        assert r.status_code == 200, r.text
    finally:
        for s in socks:
            s.close()
        gw.stop()


def test_a_body_that_completes_while_the_gateway_is_full_is_shed(tmp_path: Path, liar: LyingUpstream) -> None:
    liar.delay_s = 1.5  # the one in-flight slot stays held by a slow answer

    def events() -> Iterator[Json]:
        yield chunk("slow")
        yield chunk(None, {"prompt_tokens": 3, "completion_tokens": 1})

    liar.events = events
    gw = start_gateway(tmp_path, lying_policy(liar.base_url, "server: {max_in_flight: 1}\n"))
    key = gw.key("capped")
    (sock,) = stalled_bodies(gw.port, key, 1)
    try:
        import threading

        slow = threading.Thread(
            target=gw.post,
            args=(CHAT, {"model": "lie", "messages": HELLO, "stream": True}),
            kwargs={"tenant": "capped"},
        )
        slow.start()
        deadline = time.monotonic() + 5
        while not liar.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        rest = '"model": "lie", "messages": [{"role": "user", "content": "hi"}]}'
        sock.sendall(rest.ljust(999).encode())  # the body is whole now, and the gateway is full
        answer = answer_of(sock)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"retry-after: 1" in answer.lower() and b'"code":"overloaded"' in answer
        slow.join(10)
        assert len(liar.requests) == 1
        rows = sorted((x["status"], x["error_code"]) for x in gw.ledger_rows())
        assert rows == [("error", "overloaded"), ("ok", None)]  # the shed one is visible too
    finally:
        sock.close()
        gw.stop()


# ----------------------------------------------------------------- class 5: lying usage
LIES = [-5, 10**19, None, "12", True, 1.5]


@pytest.mark.parametrize("lie", LIES, ids=[repr(x) for x in LIES])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_impossible_usage_is_estimated_and_the_row_is_written(
    lgw: RunningGateway, liar: LyingUpstream, lie: object, stream: bool
) -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": lie, "total_tokens": 4}
    liar.json = chat_body("hello back", usage=usage)
    liar.events = lambda: iter([chunk("hello"), chunk(" back"), chunk(None, usage)])
    body = {"model": "lie", "messages": HELLO, "stream": stream}
    r = lgw.post(CHAT, body, tenant="capped")
    assert r.status_code == 200, r.text
    if stream:
        assert sse_events(r.text)[-1] == "[DONE]"
    rows = [x for x in lgw.ledger_rows() if x["tenant"] == "capped"]
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "ok" and row["usage_estimated"]
    assert row["input_tokens"] == 3 and 0 <= row["output_tokens"] < 100, row
    assert row["cost_usd"] is not None and Decimal(str(row["cost_usd"])) < Decimal("0.001")
    metrics = lgw.get("/metrics").text
    assert 'switchyard_usage_estimated_total{provider="liar"' in metrics


# ----------------------------------------------------------------- class 8: every secret redacted
KEY = "liarKey0123456789abcdefXYZ"  # no sk- prefix
HEADER = "hdr-Secret-9f8e7d6c5b4a3210"


@pytest.mark.parametrize(
    "echo",
    [
        f"bad header value {HEADER}",
        f"bad token Token {HEADER[4:20]}",  # a partial echo of a header value
        f"Incorrect API key provided: {KEY[:14]}****",  # a prefix of a key without sk-
        f"key ends in ...{KEY[-10:]}",
        f"full key {KEY}",
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_upstream_echoes_of_any_configured_secret_are_redacted(
    tmp_path: Path, liar: LyingUpstream, echo: str, stream: bool
) -> None:
    provider = f"    headers: {{x-custom-auth: {HEADER}, authorization: 'Token {HEADER}'}}\n"
    policy = lying_policy(liar.base_url, provider_extra=provider).replace(
        "api_key: sk-liar-secret-0123456789abcdef", f"api_key: {KEY}"
    )
    gw = start_gateway(tmp_path, policy)
    try:
        liar.status = 400
        liar.json = {"error": {"message": echo, "type": "invalid_request_error", "code": None}}
        r = gw.post(CHAT, {"model": "lie", "messages": HELLO, "stream": stream}, tenant="capped")
        assert r.status_code >= 400
        assert liar.headers_seen and liar.headers_seen[-1].get("x-custom-auth") == HEADER
        for secret in (KEY, HEADER):
            for i in range(len(secret) - 8 + 1):
                assert secret[i : i + 8] not in r.text, (secret[i : i + 8], r.text)
        assert "[REDACTED]" in r.text
    finally:
        gw.stop()


# ----------------------------------------------------------------- class 10: admin numbers bounded
@pytest.mark.parametrize(
    "limits",
    [
        {"daily_usd": 1e30},
        {"monthly_usd": "1e30"},
        {"rpm": 1e23},
        {"tpm": 10**20},
        {"rpm": True},
        {"daily_usd": "NaN"},
    ],
)
def test_admin_numbers_are_bounded(lgw: RunningGateway, limits: dict[str, Any]) -> None:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(timeout=10) as c:
        r = c.post(lgw.url + "/admin/keys", json={"tenant": "team-z", **limits}, headers=admin)
        assert r.status_code == 400, r.text
        assert next(iter(limits)) in r.json()["error"]["message"]
        ok = c.post(lgw.url + "/admin/keys", json={"tenant": "team-z", "daily_usd": 5}, headers=admin)
        assert ok.status_code == 201, ok.text
        put = c.put(lgw.url + f"/admin/keys/{ok.json()['key_id']}/limits", json=limits, headers=admin)
        assert put.status_code == 400, put.text
        assert c.get(lgw.url + "/admin/budgets", headers=admin).status_code == 200
        assert c.get(lgw.url + "/metrics").status_code == 200
        spend = c.get(lgw.url + "/admin/spend?since=99999999999999999999d", headers=admin)
        assert spend.status_code < 500, spend.text


def test_huge_limits_stored_by_another_path_do_not_break_observability(
    lgw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.limits import keys
    from gateway.limits.keys import KeyLimits, KeyStore

    with pytest.raises(ValueError, match="at most"):
        KeyStore(lgw.settings.keys_db).set_limits("k", KeyLimits(None, None, Decimal("1e30"), None))
    monkeypatch.setattr(keys, "MAX_LIMIT", Decimal("1e40"))  # a row stored before the bound
    store = KeyStore(lgw.settings.keys_db)
    _, record = store.create("team-h")
    store.set_limits(record.key_id, KeyLimits(10**15, 10**15, Decimal("1e30"), Decimal("1e30")))
    lgw.app_state.services.limits.refresh_key_limits()
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert lgw.get("/admin/budgets", headers=admin).status_code == 200
    assert lgw.get("/metrics").status_code == 200


# ----------------------------------------------------------------- class 6: CPU on the loop
def test_stream_assembly_is_linear_in_the_chunks() -> None:
    from gateway.cache.replay import StreamAssembler

    def assemble(n: int) -> float:
        asm = StreamAssembler()
        t0 = time.perf_counter()
        for _ in range(n):
            asm.add(chunk("0123456789"))
        asm.add(
            {
                "choices": [
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}
                ]
            }
        )
        assert len(asm.completion()["choices"][0]["message"]["content"]) == 10 * n
        return time.perf_counter() - t0

    small, big = assemble(20_000), assemble(160_000)
    assert big < 2.0, big  # quadratic concatenation: ~10 GB copied, many seconds
    assert big < 8 * 3 * small + 0.2, (small, big)


@pytest.mark.parametrize("size_mb", [2, 6])
def test_a_huge_prompt_does_not_stall_the_loop(tmp_path: Path, liar: LyingUpstream, size_mb: int) -> None:
    liar.json = chat_body("ok", usage=None)  # no usage: the gateway counts the prompt itself
    gw = start_gateway(tmp_path, lying_policy(liar.base_url).replace("daily_usd: 1}", "daily_usd: 100}"))
    try:
        from gateway.ledger.tokens import count_text

        count_text("warm", "lying-model")  # the encoding loads once per process (not measured)
        big = "x" * (size_mb * 1024 * 1024)  # no spaces: the tokenizer's worst case
        body = {"model": "lie", "messages": [{"role": "user", "content": big}], "max_tokens": 8}
        worst, r = healthz_while(gw.port, lambda: gw.post(CHAT, body, tenant="capped"))
        assert r.status_code == 200, r.text
        row = next(x for x in gw.ledger_rows() if x["tenant"] == "capped")
        assert row["usage_estimated"] and row["input_tokens"] > 100_000
        print(f"{size_mb} MB prompt: slowest /healthz {worst * 1000:.0f} ms")
        assert worst < 0.3, worst
    finally:
        gw.stop()


def test_the_semantic_layer_does_not_embed_or_store_a_huge_prompt() -> None:
    from gateway.cache.semantic_layer import MAX_TEXT_CHARS, SemanticLayer
    from gateway.config.policy import Policy
    from gateway.flow.services import TaskOwner

    class NoEmbedder:
        async def embed(self, text: str) -> Any:
            raise AssertionError("a huge prompt was embedded")

    layer = SemanticLayer(spawn=TaskOwner().spawn)
    layer._embedder = NoEmbedder()  # type: ignore[assignment]
    policy = Policy.model_validate(
        {
            "providers": {"p": {"type": "openai", "base_url": "http://x/v1", "api_key": "k"}},
            "models": {"m": {"provider": "p", "upstream": "m", "price": {"input": 1, "output": 1}}},
            "routes": {"r": {"targets": ["m"], "semantic_cache": {"enabled": True}}},
        }
    )
    body = {"model": "r", "messages": [{"role": "user", "content": "y" * (MAX_TEXT_CHARS + 1)}]}
    assert asyncio.run(layer.lookup(policy, "r", "t", body)) is None


# ----------------------------------------------------------------- class 9: revocation mid-outage
def test_a_key_confirmed_before_an_outage_works_for_at_most_the_stale_bound(tmp_path: Path) -> None:
    import sqlite3

    from gateway.limits.key_cache import KeyCache
    from gateway.limits.keys import KeyStore

    store = KeyStore(tmp_path / "keys.db")
    key, rec = store.create("t")
    now = [0.0]
    cache = KeyCache(store, ttl=5.0, stale=60.0, clock=lambda: now[0])
    assert cache.lookup(key) == rec
    store.revoke(rec.key_id)  # revoked, then the store goes away before this process sees it

    def down(digest: str) -> Any:
        raise sqlite3.OperationalError("database is unreachable")

    store.lookup_hash = down  # type: ignore[method-assign]
    for t in (6.0, 30.0, 59.0):  # past the TTL, within the stale bound: still honoured
        now[0] = t
        assert cache.lookup(key) == rec
    now[0] = 61.0  # the promise: at most 60 s after the last confirmation
    with pytest.raises(sqlite3.Error):
        cache.lookup(key)


# ----------------------------------------------------------------- class 6: a bounded count per body
def test_a_body_of_many_texts_is_tokenized_within_a_bounded_number_of_characters() -> None:
    from gateway.ledger import tokens

    enc = tokens.encoding_for("lying-model")
    encoded = [0]
    real = enc.encode_ordinary

    def counting(text: str) -> list[int]:  # the real tokenizer, with the characters it was given
        encoded[0] += len(text)
        return real(text)

    text = "the quick brown fox jumps over the lazy dog " * 1400  # ~62 KB each, under EXACT_CHARS
    body = {"model": "m", "messages": [{"role": "user", "content": text} for _ in range(128)]}  # 8 MB
    exact = tokens.REPLY_PRIMING + 128 * (tokens.TOKENS_PER_MESSAGE + len(real(text)))
    enc.encode_ordinary = counting  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        n = tokens.count_prompt_tokens(body, "lying-model")
        took = time.perf_counter() - t0
    finally:
        del enc.encode_ordinary
    print(
        f"8 MB in 128 messages: {encoded[0]} characters encoded, {took * 1000:.0f} ms, {n} vs {exact} tokens"
    )
    assert encoded[0] <= tokens.BODY_EXACT_CHARS  # not the 8 MB
    assert exact <= n <= exact * 1.05  # the rest at the measured rate: close, and not below
    # a body of one huge unbroken word is bounded too, and never counted above its bytes
    one = {"model": "m", "messages": [{"role": "user", "content": "é" * 3_000_000}]}
    encoded[0] = 0
    enc.encode_ordinary = counting  # type: ignore[method-assign]
    try:
        n = tokens.count_prompt_tokens(one, "lying-model")
    finally:
        del enc.encode_ordinary
    assert encoded[0] <= tokens.BODY_EXACT_CHARS and 0 < n <= 6_000_000 + 10
