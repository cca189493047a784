"""The lanes' gates (gateway/flow/batch_runner.py ``slots``): low priority runs up to the
route's concurrency and pauses while interactive requests are in flight; the self-hosted lane
also waits until every probed replica of the route's engine has room (queue and KV use), and
an engine not probed yet counts as busy."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.core.batch import Batch
from gateway.flow.batch_runner import BatchRunner
from gateway.routing.engine_load import ReplicaSample
from tests.flow_fakes import POLICY, services


def _batch(model: str) -> Batch:
    now = time.time()
    return Batch("batch_x", "t", None, "openai", "/v1/chat/completions", model, "file-1", "24h", None,
                 "in_progress", now, now + 3600)  # fmt: skip


def test_low_priority_bounded_and_yielding(tmp_path: Path) -> None:
    policy = {
        **POLICY,
        "routes": {"r": {"targets": ["small"], "batch": {"concurrency": 3, "yield_above": 2}}},
    }
    svc = services(tmp_path, policy)
    runner = BatchRunner(lambda: svc)
    assert runner.slots(svc, _batch("r")) == 3
    runner._per_batch["batch_x"] = 2
    assert runner.slots(svc, _batch("r")) == 1
    runner.interactive = lambda: 2  # two interactive requests in flight: the batch waits
    assert runner.slots(svc, _batch("r")) == 0


@pytest.mark.parametrize(
    ("waiting", "kv", "room"),
    [(None, None, False), (0.0, 0.3, True), (1.0, 0.3, False), (0.0, 0.7, False)],
)
def test_self_hosted_waits_for_spare_engine_capacity(
    tmp_path: Path, waiting: float | None, kv: float | None, room: bool
) -> None:
    policy = {
        "providers": {"engine": {"type": "openai", "base_url": "http://127.0.0.1:9/v1", "key_required": False,
                                 "self_hosted": True, "load": {"probe_interval_s": 1}}},
        "models": {"llama": {"provider": "engine", "price": {"input": "0", "output": "0"}}},
        "routes": {"r": {"targets": ["llama"], "batch": {"lane": "self_hosted", "concurrency": 4,
                                                         "yield_above": None, "max_waiting": 0, "max_kv_usage": 0.5}}},
    }  # fmt: skip
    svc = services(tmp_path, policy)
    svc.engines.configure(svc.policy)
    if waiting is not None and kv is not None:
        sample = ReplicaSample(waiting, 1.0, kv, None, None, None, None)
        for replica in svc.engines.engines["engine"].replicas:
            replica.observe(sample, time.monotonic())
    assert BatchRunner(lambda: svc).slots(svc, _batch("r")) == (4 if room else 0)
