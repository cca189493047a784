"""Per-key rate limits shared through Redis (one atomic Lua script per request) by two
`switchyard serve` processes: their combined rate stays within the limit."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.limits.keys import KeyStore
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy
from tests.limits_helpers import HELLO, REDIS_URL, fire, redis_prefix, serve

pytestmark = pytest.mark.redis
RPM = 30


@pytest.fixture
def prefix() -> Iterator[str]:
    with redis_prefix("sytest-rl") as p:
        yield p


def test_two_processes_share_the_key_rpm(tmp_path: Path, mock: MockUpstream, prefix: str) -> None:
    home = tmp_path / "home"
    policy = tmp_path / "policy.yaml"
    limits = f"limits: {{redis_url: '{REDIS_URL}', redis_prefix: '{prefix}', redis_timeout_s: 2, key_rpm: {RPM}}}\n"
    policy.write_text(mock_policy(mock.base_url, limits))
    key, _ = KeyStore(home / "keys.db").create("team-rl")
    gws = [serve(home, policy, tmp_path / f"gw{i}.log") for i in range(2)]
    try:
        urls = [g.url for g in gws]
        started = time.monotonic()
        responses = []
        for _ in range(3):
            responses += fire(urls, key, RPM, {"model": "auto", "messages": HELLO})
        elapsed = time.monotonic() - started
    finally:
        for g in gws:
            g.stop()
    ok = [r for r in responses if r.status_code == 200]
    limited = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(limited) == 3 * RPM
    # a full bucket plus what refilled (RPM/60 per second) while the test ran; each process
    # alone would have admitted RPM, the two together 2 x RPM.
    allowed = RPM + math.ceil(elapsed * RPM / 60)
    assert RPM <= len(ok) <= allowed, (len(ok), allowed, elapsed)
    served_by = {r.url.port for r in ok}
    assert len(served_by) == 2  # both replicas served some
    for r in limited:
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(r.headers["retry-after"]) >= 1
