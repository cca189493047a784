"""Rate limits: token buckets (all-or-nothing over several buckets), per-key rpm and tpm on a
real gateway, Retry-After on every 429."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.limits.keys import KeyLimits, KeyStore
from gateway.limits.ratelimit import BucketCheck, MemoryBuckets
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway
from tests.limits_helpers import HELLO, fire


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_refills_at_the_per_minute_rate() -> None:
    clock = Clock()
    b = MemoryBuckets(clock)
    c = BucketCheck("rpm:key:k", 60, 1.0, "take", "60 rpm")
    assert all(b.apply([c]) is None for _ in range(60))
    refusal = b.apply([c])
    assert refusal is not None and refusal[0] == 0 and refusal[1] == pytest.approx(1.0)
    clock.now += 1.0  # one token back
    assert b.apply([c]) is None
    assert b.apply([c]) is not None


def test_several_buckets_are_all_or_nothing() -> None:
    clock = Clock()
    b = MemoryBuckets(clock)
    roomy = BucketCheck("a", 100, 1.0, "take", "a")
    tight = BucketCheck("b", 1, 1.0, "take", "b")
    assert b.apply([roomy, tight]) is None
    assert b.apply([roomy, tight]) == (1, pytest.approx(60.0))
    # the refused request did not take from `roomy`: 99 left
    assert all(b.apply([roomy]) is None for _ in range(99))
    assert b.apply([roomy]) is not None


def test_tokens_per_minute_debit_then_wait() -> None:
    clock = Clock()
    b = MemoryBuckets(clock)
    check = BucketCheck("tpm", 600, 0.0, "check", "600 tpm")
    assert b.apply([check]) is None
    assert b.apply([BucketCheck("tpm", 600, 900.0, "debit", "600 tpm")]) is None  # 600 - 900 = -300
    refusal = b.apply([check])
    assert refusal is not None and refusal[1] == pytest.approx(30.1)  # (1 + 300) / 10 per s
    clock.now += 30.2
    assert b.apply([check]) is None


def test_key_rpm_on_a_real_gateway_with_retry_after(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, "limits: {key_rpm: 5}\n"))
    try:
        responses = fire([gw.url], gw.key("team-a"), 12, {"model": "auto", "messages": HELLO})
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) == 5 and codes.count(429) == 7
        for r in responses:
            if r.status_code == 429:
                err = r.json()["error"]
                assert err["code"] == "rate_limit_exceeded"
                assert "5 requests per minute for key" in err["message"]
                assert int(r.headers["retry-after"]) >= 1
        # another key has its own bucket
        assert (
            gw.post("/v1/chat/completions", {"model": "auto", "messages": HELLO}, tenant="team-c").status_code
            == 200
        )
        metrics = gw.get("/metrics").text
        assert 'switchyard_rejections_total{code="rate_limit_exceeded"} 7.0' in metrics
    finally:
        gw.stop()


def test_key_tpm_from_the_key_store(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        key, rec = KeyStore(gw.settings.keys_db).create("team-t")
        KeyStore(gw.settings.keys_db).set_limits(rec.key_id, KeyLimits(tpm=20))
        gw.app_state.services.limits.refresh_key_limits()
        headers = {"authorization": f"Bearer {key}"}
        body = {"model": "auto", "messages": HELLO}
        codes = []
        for _ in range(4):  # each request uses 2 prompt + 8 completion tokens (mock counts)
            r = gw.post("/v1/chat/completions", body, headers=headers)
            codes.append(r.status_code)
        assert codes[:2] == [200, 200] and codes[-1] == 429, codes
        assert "20 tokens per minute" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
    finally:
        gw.stop()
