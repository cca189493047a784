"""Warm up before ready: on a fresh home the embedder's one-time ONNX export runs at start-up,
``/readyz`` answers 503 (``checks.models: false``) until it is done, the log says what it is
doing, and the first semantic-cache request after ready pays nothing for it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from gateway.cache import embed_backends
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway
from tests.test_semantic_gateway import policy_with_faq


@pytest.mark.slow  # the real one-time export (~15 s alone, ~60 s on a busy 2-core machine)
def test_readyz_is_503_until_the_embedder_is_loaded(
    tmp_path: Path, mock: MockUpstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not (embed_backends.can_export() or embed_backends.packaged_onnx()):
        pytest.skip("needs the ml extra (an int8 model source)")
    models = tmp_path / "fresh-models"  # a fresh home and model folder: nothing exported yet
    monkeypatch.setenv("SWITCHYARD_MODEL_DIR", str(models))
    caplog.set_level(logging.INFO, logger="switchyard")
    gw = start_gateway(tmp_path, policy_with_faq(mock.base_url))
    try:
        seen: list[tuple[int, dict[str, object]]] = []
        started = time.monotonic()
        with httpx.Client(timeout=5) as c:
            while time.monotonic() - started < 300:
                r = c.get(gw.url + "/readyz")
                seen.append((r.status_code, r.json()["checks"]))
                if r.status_code == 200:
                    break
                time.sleep(0.05)
            warm_s = time.monotonic() - started
            assert seen[-1][0] == 200, seen[-5:]
            assert seen[0] == (503, {"policy": True, "ledger": True, "models": False}), seen[0]
            assert seen[-1][1]["models"] is True
            first = time.monotonic()
            r = c.post(
                gw.base_url + "/chat/completions",
                json={
                    "model": "faq",
                    "messages": [{"role": "user", "content": "How do I reset my password?"}],
                    "temperature": 0,
                },
                headers=gw.headers(),
                timeout=30,
            )
            first_s = time.monotonic() - first
        assert r.status_code == 200, r.text
        assert r.headers["x-switchyard-cache"] == "miss"
        assert first_s < min(2.0, warm_s), (first_s, warm_s)  # the load happened before ready
        messages = [rec.getMessage() for rec in caplog.records if rec.name.startswith("switchyard")]
        assert any(m.startswith("warming the embedder for routes faq (") for m in messages), messages
        assert any(m.startswith("embedder ready for routes faq in ") for m in messages), messages
        if embed_backends.can_export():
            assert any("one-time ONNX export" in m for m in messages), messages
            assert embed_backends.onnx_path(gw.home, models).is_file()
    finally:
        gw.stop()


def test_ready_means_the_models_are_in(tmp_path: Path, mock: MockUpstream) -> None:
    """With the export already made (the session's shared model folder), the first 200 from
    /readyz comes only once the embedder and the verifier are loaded, whatever the timing."""
    if not (embed_backends.can_export() or embed_backends.packaged_onnx()):
        pytest.skip("needs the ml extra (an int8 model source)")
    gw = start_gateway(tmp_path, policy_with_faq(mock.base_url))
    try:
        semantic = gw.app_state.services.semantic
        deadline = time.monotonic() + 300
        with httpx.Client(timeout=5) as c:
            while c.get(gw.url + "/readyz").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        assert semantic._embedder is not None and semantic._cache is not None
    finally:
        gw.stop()


def test_a_route_without_the_embedder_is_ready_at_once(tmp_path: Path, mock: MockUpstream) -> None:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))  # no semantic cache, no classifier
    try:
        r = gw.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"]["models"] is True
        assert gw.app_state.services.semantic._embedder is None  # nothing was loaded
    finally:
        gw.stop()
