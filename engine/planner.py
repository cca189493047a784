"""Capacity planner: do a profile's weights fit its GPUs, how much KV cache is left, and how many
sequences of max_model_len fit in it.

KV cache bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element. With
grouped-query attention KV heads are far fewer than attention heads, so the textbook
"2 x layers x hidden x bytes" overstates Llama-3.1-70B 8x (10.7 GB vs 1.34 GB per 4,096-token
sequence in FP16)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.profiles import Profile

GIB = 1024**3
GB = 10**9

# GPU memory in bytes (what the driver reports as total, decimal GB as sold).
GPUS: dict[str, int] = {
    "l4-24gb": 24 * GB,
    "a10g-24gb": 24 * GB,
    "rtx4090-24gb": 24 * GB,
    "l40s-48gb": 48 * GB,
    "a100-40gb": 40 * GB,
    "a100-80gb": 80 * GB,
    "h100-80gb": 80 * GB,
    "h200-141gb": 141 * GB,
    "b200-180gb": 180 * GB,
}

# Architectures of well-known models, in the shape of their Hugging Face config.json.
KNOWN: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama-3.1-70b": {
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama-3.1-405b": {
        "hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128,
        "num_key_value_heads": 8, "intermediate_size": 53248, "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "tie_word_embeddings": False, "attention_bias": True,
    },
    "qwen2.5-72b": {
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064,
        "tie_word_embeddings": False, "attention_bias": True,
    },
    "mistral-7b": {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32768,
        "tie_word_embeddings": False,
    },
}  # fmt: skip

# Weight bytes per parameter by quantization; int4 schemes add group scales/zeros
# (group size 128: 2.5 bytes per 64 bytes of packed weights, ~4%).
WEIGHT_BYTES = {"none": 2.0, "fp8": 1.0, "awq": 0.5, "awq_marlin": 0.5, "gptq": 0.5}
SCALE_OVERHEAD = {"awq": 2.5 / 64, "awq_marlin": 2.5 / 64, "gptq": 2.5 / 64, "fp8": 0.001}
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "auto": 2.0}
# Per-GPU reserve outside weights and KV cache: CUDA context, activations, CUDA graphs.
RUNTIME_RESERVE_BYTES = int(1.5 * GIB)


class PlanError(Exception):
    """The profile cannot be planned (unknown architecture, unknown GPU) or does not fit."""


@dataclass(frozen=True, slots=True)
class Architecture:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    source: str

    @property
    def params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (attn + mlp + 2 * self.hidden) + embed + self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)


def architecture_from_config(cfg: dict[str, Any], source: str) -> Architecture:
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        return Architecture(
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            source=source,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{source}: config.json lacks a usable {exc}") from None


def _known_key(model: str) -> str | None:
    name = model.rsplit("/", 1)[-1].lower().replace("meta-", "")
    for key in sorted(KNOWN, key=len, reverse=True):
        if name.startswith(key) or f"-{key}" in name or key in name:
            return key
    return None


def architecture(model: str) -> Architecture:
    """From the model's local config.json when ``model`` is a directory, else the built-in table."""
    config = Path(model) / "config.json"
    if config.is_file():
        return architecture_from_config(json.loads(config.read_text()), str(config))
    key = _known_key(model)
    if key is None:
        known = ", ".join(sorted(KNOWN))
        raise PlanError(
            f"unknown architecture for '{model}': use a local model directory with config.json "
            f"or one of the built-in models ({known})"
        )
    return architecture_from_config(KNOWN[key], f"built-in table ({key})")


def kv_bytes_per_token(arch: Architecture, kv_dtype_bytes: float) -> int:
    return int(2 * arch.layers * arch.kv_heads * arch.head_dim * kv_dtype_bytes)


def textbook_kv_bytes_per_token(arch: Architecture, kv_dtype_bytes: float) -> int:
    """The MHA formula that ignores GQA (for comparison only)."""
    return int(2 * arch.layers * arch.hidden * kv_dtype_bytes)


def weight_bytes(arch: Architecture, quantization: str, dtype: str) -> int:
    full = DTYPE_BYTES[dtype]
    if quantization in ("none", "compressed-tensors"):
        per = full if quantization == "none" else 1.0
        return int(arch.params * per)
    per = WEIGHT_BYTES[quantization] * (1 + SCALE_OVERHEAD.get(quantization, 0.0))
    # Embeddings and the LM head stay in 16 bits under weight-only quantization.
    return int(arch.embedding_params * full + (arch.params - arch.embedding_params) * per)


@dataclass(frozen=True, slots=True)
class Plan:
    profile: str
    model: str
    architecture_source: str
    gpu: str
    gpu_count: int
    gpu_memory_bytes: int
    usable_bytes: int
    params: int
    weights_bytes: int
    kv_cache_dtype: str
    kv_bytes_per_token: int
    textbook_kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_budget_bytes: int
    kv_tokens: int
    max_model_len: int
    max_sequences: int
    recommended_max_num_seqs: int
    fits: bool
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan(profile: Profile, gpu: str | None = None, avg_len: int | None = None) -> Plan:
    """Plan ``profile`` on its own GPU kind (or ``gpu``); ``avg_len`` (tokens per sequence on
    average, default max_model_len / 4) sizes the max_num_seqs recommendation."""
    kind = (gpu or profile.gpu.kind).lower()
    if kind not in GPUS:
        raise PlanError(f"unknown GPU '{kind}'; known: {', '.join(sorted(GPUS))}")
    arch = architecture(profile.model)
    count = profile.tensor_parallel_size
    total = GPUS[kind] * count
    usable = int(total * profile.gpu_memory_utilization) - RUNTIME_RESERVE_BYTES * count
    weights = weight_bytes(arch, profile.quantization, profile.dtype)
    kv_elem = 1.0 if profile.kv_cache_dtype.startswith("fp8") else DTYPE_BYTES[profile.dtype]
    per_token = kv_bytes_per_token(arch, kv_elem)
    per_seq = per_token * profile.max_model_len
    budget = usable - weights
    kv_tokens = max(0, budget // per_token)
    max_seqs = max(0, budget // per_seq)
    typical = avg_len or max(1, profile.max_model_len // 4)
    by_memory = kv_tokens // typical
    recommended = max(1, min(512, 2 ** int(math.log2(by_memory)) if by_memory >= 1 else 1))
    problem = None
    if budget <= 0:
        problem = (
            f"weights need {weights / GB:.1f} GB but only {usable / GB:.1f} GB is usable on "
            f"{count} x {kind} at gpu_memory_utilization {profile.gpu_memory_utilization}: "
            "quantize, add GPUs (tensor_parallel_size) or pick a bigger GPU"
        )
    elif max_seqs < 1:
        problem = (
            f"one sequence of max_model_len {profile.max_model_len} needs {per_seq / GB:.2f} GB of KV "
            f"cache but only {budget / GB:.2f} GB is left after the weights: lower max_model_len to "
            f"at most {kv_tokens} or use kv_cache_dtype fp8"
        )
    return Plan(
        profile=profile.name,
        model=profile.model,
        architecture_source=arch.source,
        gpu=kind,
        gpu_count=count,
        gpu_memory_bytes=total,
        usable_bytes=usable,
        params=arch.params,
        weights_bytes=weights,
        kv_cache_dtype=profile.kv_cache_dtype,
        kv_bytes_per_token=per_token,
        textbook_kv_bytes_per_token=textbook_kv_bytes_per_token(arch, kv_elem),
        kv_bytes_per_sequence=per_seq,
        kv_budget_bytes=max(0, budget),
        kv_tokens=kv_tokens,
        max_model_len=profile.max_model_len,
        max_sequences=max_seqs,
        recommended_max_num_seqs=recommended if problem is None else 0,
        fits=problem is None,
        problem=problem,
    )


def render(p: Plan) -> str:
    lines = [
        f"profile {p.profile}: {p.model} ({p.params / 1e9:.2f}B params, "
        f"architecture from {p.architecture_source})",
        f"  GPUs            {p.gpu_count} x {p.gpu} = {p.gpu_memory_bytes / GB:.0f} GB, "
        f"usable {p.usable_bytes / GB:.1f} GB",
        f"  weights         {p.weights_bytes / GB:.2f} GB",
        f"  KV per token    {p.kv_bytes_per_token / 1024:.0f} KiB ({p.kv_cache_dtype}; "
        f"GQA-unaware formula: {p.textbook_kv_bytes_per_token / 1024:.0f} KiB)",
        f"  KV per sequence {p.kv_bytes_per_sequence / GB:.2f} GB at max_model_len {p.max_model_len}",
        f"  KV cache        {p.kv_budget_bytes / GB:.1f} GB = {p.kv_tokens:,} tokens",
        f"  full sequences  {p.max_sequences}",
    ]
    if p.fits:
        lines.append(f"  recommended max_num_seqs: {p.recommended_max_num_seqs}")
    else:
        lines.append(f"  DOES NOT FIT: {p.problem}")
    return "\n".join(lines)
