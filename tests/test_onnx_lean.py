"""onnx_lean: run-time Reshape targets become constants, never a changed output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import require_module
from tests.semcache_support import embedder  # noqa: F401

onnx = require_module("onnx")


def test_constant_targets_from_probes() -> None:
    from gateway.cache.onnx_lean import _constant_target

    def runs(target: Any, shape: Any) -> list[tuple[Any, tuple[int, ...]]]:
        return [(np.asarray(target(b, s)), shape(b, s)) for b, s in ((2, 7), (3, 11))]

    heads = runs(lambda b, s: [b, s, 12, 32], lambda b, s: (b, s, 384))
    assert _constant_target(heads) == [0, 0, 12, 32]
    merge = runs(lambda b, s: [b, s, 384], lambda b, s: (b, s, 12, 32))
    assert _constant_target(merge) == [0, 0, 384]
    flat = runs(lambda b, s: [b * s, 384], lambda b, s: (b, s, 384))
    assert _constant_target(flat) == [-1, 384]
    two_free = runs(lambda b, s: [b * s, s * 2], lambda b, s: (b, s, 384))
    assert _constant_target(two_free) is None  # two dimensions no constant can say: left alone


def test_the_export_has_constant_reshape_targets_and_the_packaged_file_is_left_alone(
    embedder: Any,  # noqa: F811
    shared_model_dir: Path,
    tmp_path: Path,
) -> None:
    from gateway.cache import embed_backends
    from gateway.cache.onnx_lean import lean

    source, path = embed_backends.onnx_source(tmp_path, shared_model_dir)
    if source != "export":
        pytest.skip("no local export (torch missing): the packaged file is served as it is")
    graph = onnx.load(str(path)).graph
    constant = {i.name for i in graph.initializer}
    reshapes = [n for n in graph.node if n.op_type == "Reshape"]
    assert sum(n.input[1] in constant for n in reshapes) >= len(reshapes) - 1  # all but the mask's
    assert not [n for n in graph.node if n.op_type == "IsNaN"]  # the softmax guards are gone
    packaged = embed_backends.packaged_onnx()
    if packaged is not None:  # a graph lean cannot rewrite without changing it comes back as it is
        model = onnx.load(str(packaged))
        out = lean(model)
        assert out is model or len(out.graph.node) < len(model.graph.node)
