"""Strip the shape arithmetic (and the softmax NaN guards) out of an exported transformer
graph, leaving its numbers alone.

The TorchScript exporter computes every ``Reshape`` target at run time (Shape -> Gather ->
Unsqueeze -> Concat chains: ~130 nodes in MiniLM-L6 after ORT's optimiser, each a kernel
launch on every run). Most of those targets are ``[batch, seq, 12, 32]`` or ``[batch, seq,
384]``, which ONNX can say as constants (``0`` copies the input's dimension, ``-1`` takes the
rest). ``lean`` replaces each target that two probe runs (different batch and sequence
sizes) show to be such a constant. It also drops the exporter's ``Where(IsNaN(p), 0, p)``
after each attention softmax: ``p`` is NaN only for a sequence whose every position is
masked, which a tokenised text (``[CLS] ... [SEP]``) never is. Then it removes the nodes
nothing reads any more and checks that the leaner graph gives bit-identical outputs on other
shapes; else it returns the graph unchanged. Measured: -6% CPU per 27-token text (-3% the
Reshape targets, -3% the guards), the same vectors to the bit.

Needs ``onnx`` and ``onnxruntime`` (the ``train`` extra: it runs at export time only)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

PROBES = ((2, 7), (3, 11))  # (batch, seq) shapes whose Reshape targets are compared
CHECKS = ((1, 5), (3, 13), (1, 40))  # shapes on which lean and original must agree exactly


def _feeds(batch: int, seq: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _session(model_bytes: bytes, optimise: bool) -> Any:
    ort: Any = importlib.import_module("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return ort.InferenceSession(model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])


def _constant_target(runs: list[tuple[np.ndarray, tuple[int, ...]]]) -> list[int] | None:
    """The one constant Reshape target that reproduces every probed (target, input shape)."""
    first, _ = runs[0]
    out: list[int | None] = []
    varying = {d for shape in PROBES for d in shape}  # a value that moves with batch or seq
    for i in range(len(first)):
        values = {int(t[i]) for t, _ in runs}
        if len(values) == 1 and next(iter(values)) not in varying:
            out.append(next(iter(values)))
        elif all(i < len(shape) and int(t[i]) == shape[i] for t, shape in runs):
            out.append(0)  # copy the input's dimension
        else:
            out.append(None)
    if out.count(None) == 1:
        out[out.index(None)] = -1
    return None if None in out else [int(v) for v in out if v is not None]


def lean(model: Any) -> Any:
    """A copy of ``model`` (an onnx ModelProto) with constant Reshape targets, or ``model``
    itself when the rewrite would change any output bit."""
    onnx: Any = importlib.import_module("onnx")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    typed = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(typed.value_info) + list(typed.input)}
    wanted: list[str] = []
    for n in reshapes:
        for name in (n.input[1], n.input[0]):
            if name not in wanted:
                wanted.append(name)
                elem = types.get(name, onnx.TensorProto.FLOAT)
                if name == n.input[1]:
                    elem = onnx.TensorProto.INT64
                probe.graph.output.append(helper.make_tensor_value_info(name, elem, None))
    sess = _session(probe.SerializeToString(), optimise=False)
    names = [o.name for o in sess.get_outputs()]
    probed = [dict(zip(names, sess.run(None, _feeds(b, s, 0)), strict=True)) for b, s in PROBES]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for k, n in enumerate(n for n in graph.node if n.op_type == "Reshape"):
        target = _constant_target([(r[n.input[1]], r[n.input[0]].shape) for r in probed])
        if target is None:
            continue
        name = f"lean_reshape_target_{k}"
        graph.initializer.append(numpy_helper.from_array(np.asarray(target, dtype=np.int64), name))
        n.input[1] = name
    _drop_nan_guards(graph)
    while True:  # drop what nothing reads any more
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    return out if _same_outputs(model, out) else model


def _drop_nan_guards(graph: Any) -> None:
    """Readers of ``Where(IsNaN(p), 0, p)`` read ``p`` itself (the Where and IsNaN die)."""
    producer = {o: n for n in graph.node for o in n.output}
    alias: dict[str, str] = {}
    for n in graph.node:
        cond = producer.get(n.input[0]) if n.op_type == "Where" else None
        if cond is not None and cond.op_type == "IsNaN" and cond.input[0] == n.input[2]:
            alias[n.output[0]] = n.input[2]
    outputs = {o.name for o in graph.output}
    for n in graph.node:
        for i, name in enumerate(n.input):
            if name in alias and name not in outputs:
                n.input[i] = alias[name]


def _same_outputs(model: Any, out: Any) -> bool:
    """Both graphs load and give bit-identical outputs on the CHECKS shapes."""
    try:
        before, after = _session(model.SerializeToString(), True), _session(out.SerializeToString(), True)
        for i, (b, s) in enumerate(CHECKS):
            feeds = _feeds(b, s, i + 1)
            pairs = zip(before.run(None, feeds), after.run(None, feeds), strict=True)
            if not all(np.array_equal(x, y) for x, y in pairs):
                return False
    except Exception:  # a target the probes misread makes an invalid graph: keep the original
        return False
    return True
