"""Deferred metric updates (``telemetry.metrics._Memo``, one process): a scrape reads exactly
what updating prometheus_client directly would have given, bucket for bucket."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import LATENCY_BUCKETS, OVERHEAD_BUCKETS, Metrics


def _updates(m: Metrics) -> None:
    for i in range(50):
        m.requests.labels("chat", "r", "small", "mock", "ok", "miss").inc()
        m.tokens.labels("r", "small", "input").inc(12 + i)
        m.latency.labels("chat", "r", "false").observe(0.0004 * i)
        m.overhead.labels("chat", "false").observe(0.0001 * (i % 7))  # bounds hit exactly too
        m.record_cost("t", "r", "small", "mock", Decimal("0.0000072") * i)
    for edge in (*LATENCY_BUCKETS, 0.0, 1e9):
        m.latency.labels("chat", "edges", "true").observe(edge)
    for edge in OVERHEAD_BUCKETS:
        m.overhead.labels("chat", "true").observe(edge)
    m.latency.labels("chat", "nan", "false").observe(math.nan)
    m.ttft.labels("r").observe(0.002)
    m.breaker_open.labels("small").set(1)  # gauges are never deferred


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_a_deferred_scrape_equals_direct_updates(tmp_path: Path) -> None:
    deferred = Metrics()
    direct = Metrics(multiprocess_dir=str(tmp_path))  # multi-process mode: every update direct
    assert deferred.requests._wrapped is not None and direct.requests._wrapped is None
    for m in (deferred, direct):
        _updates(m)
    got = _samples(deferred.render())
    # the direct one's own registry (its render would read the multi-process files instead)
    want = _samples(generate_latest(direct.registry))
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert _same(got[key], value), (key, got[key], value)
    bucket = (
        "switchyard_request_duration_seconds_bucket",
        (("endpoint", "chat"), ("le", "0.001"), ("route", "edges"), ("stream", "true")),
    )
    assert got[bucket] == 3  # 0.0, 0.0005 and 0.001: a bound counts in its own bucket


def test_updates_after_a_scrape_reach_the_next_one() -> None:
    m = Metrics()
    m.requests.labels("chat", "r", "small", "mock", "ok", "miss").inc()
    key = (
        "switchyard_requests_total",
        (
            ("cache", "miss"),
            ("endpoint", "chat"),
            ("model", "small"),
            ("provider", "mock"),
            ("route", "r"),
            ("status", "ok"),
        ),
    )
    assert _samples(m.render())[key] == 1
    m.requests.labels("chat", "r", "small", "mock", "ok", "miss").inc(2)
    assert _samples(m.render())[key] == 3
    assert _samples(m.render())[key] == 3  # a flush hands each update over once
    with pytest.raises(ValueError):
        m.requests.labels("chat", "r", "small", "mock", "ok", "miss").inc(-1)
