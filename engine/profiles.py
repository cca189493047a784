"""Engine profiles: one YAML file per way of running a model on vLLM, validated like the policy
(pydantic, extra="forbid", every problem reported with its YAML path)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"

Quantization = Literal["awq", "awq_marlin", "fp8", "compressed-tensors", "gptq", "none"]
# Quantization methods vLLM's CPU backend cannot run: their profiles are GPU-only.
GPU_ONLY_QUANTIZATION = frozenset({"awq_marlin", "fp8"})
GPU_ONLY_SPECULATION = frozenset({"eagle", "eagle3", "medusa", "mtp"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    kind: str = Field(min_length=1)  # e.g. h100-80gb; see engine.planner.GPUS
    count: int = Field(default=1, ge=1)  # GPUs per replica (normally = tensor_parallel_size)
    usd_per_hour: Decimal = Field(ge=0)  # per GPU


class SpeculativeSpec(_Strict):
    """vLLM's --speculative-config: ngram (prompt lookup), a draft model, or eagle."""

    method: Literal["ngram", "draft_model", "eagle", "eagle3", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=16)
    model: str | None = None  # draft / eagle head
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _model_needed(self) -> SpeculativeSpec:
        if self.method in ("draft_model", "eagle", "eagle3") and not self.model:
            raise ValueError(f"method '{self.method}' needs 'model'")
        if self.method == "ngram" and self.model:
            raise ValueError("method 'ngram' takes no 'model'")
        return self

    def to_vllm(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "draft_model":
            out.pop("method")  # vLLM infers a draft model from "model"
        for name in ("model", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


class Profile(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    model: str = Field(min_length=1)  # HF id or a local path
    served_model_name: str | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: Quantization = "none"
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    enable_prefix_caching: bool = True  # vLLM V1's default
    enable_chunked_prefill: bool = True
    speculative: SpeculativeSpec | None = None
    max_model_len: int = Field(ge=16)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prompt_tokens_details: bool = True  # usage then reports cached_tokens
    gpu: GpuSpec
    gpu_only: bool = False  # set for profiles the CPU backend cannot run
    extra_args: list[str] = Field(default_factory=list)  # passed to vLLM verbatim, at the end
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("extra_args")
    @classmethod
    def _flags(cls, v: list[str]) -> list[str]:
        if v and not v[0].startswith("--"):
            raise ValueError("must start with a --flag")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.gpu.count != self.tensor_parallel_size:
            raise ValueError(
                f"gpu.count ({self.gpu.count}) must equal tensor_parallel_size ({self.tensor_parallel_size})"
            )
        if self.needs_gpu and not self.gpu_only:
            raise ValueError(f"{self.gpu_only_reason} cannot run on CPU: set gpu_only: true")
        return self

    @property
    def needs_gpu(self) -> bool:
        spec = self.speculative
        return self.quantization in GPU_ONLY_QUANTIZATION or (
            spec is not None and spec.method in GPU_ONLY_SPECULATION
        )

    @property
    def gpu_only_reason(self) -> str:
        if self.quantization in GPU_ONLY_QUANTIZATION:
            return f"quantization '{self.quantization}'"
        if self.speculative is not None and self.speculative.method in GPU_ONLY_SPECULATION:
            return f"speculative method '{self.speculative.method}'"
        return "nothing"

    @property
    def usd_per_hour(self) -> Decimal:
        """What one replica costs per hour (all its GPUs)."""
        return self.gpu.usd_per_hour * self.gpu.count

    @property
    def speculative_json(self) -> str | None:
        if self.speculative is None:
            return None
        return json.dumps(self.speculative.to_vllm(), separators=(",", ":"))


class ProfileError(Exception):
    """An engine profile that cannot be used; ``problems`` lists (yaml path, message), rendered
    like the gateway's policy errors (the engine imports nothing of the gateway)."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += [f"  {path}: {msg}" if path else f"  {msg}" for path, msg in self.problems]
        return "\n".join(lines)


def yaml_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a YAML path: ``gpu.kind``, ``extra_args[0]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def parse_profile(data: Any, source: str = "<profile>") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(source, [("", "a profile is a YAML mapping")])
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = [(yaml_path(tuple(e["loc"])), e["msg"]) for e in exc.errors()]
        raise ProfileError(source, problems) from None


def resolve(name_or_path: str) -> Path:
    """A profile file path, or the name of a shipped profile (engine/profiles/NAME.yaml)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return PROFILE_DIR / f"{name_or_path}.yaml"


def load_profile(name_or_path: str) -> Profile:
    path = resolve(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        shipped = ", ".join(shipped_profiles())
        raise ProfileError(
            str(path), [("", f"cannot read: {exc.strerror}; shipped profiles: {shipped}")]
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(str(path), [("", f"not valid YAML: {exc}")]) from None
    return parse_profile(data, str(path))


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
