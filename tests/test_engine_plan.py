"""Engine profiles, the capacity planner, breakeven and calibration maths, and the CLI around
them (no engine needed)."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from engine import breakeven as be
from engine import calibration, launcher, planner
from engine.profiles import PROFILE_DIR, ProfileError, load_profile, parse_profile, shipped_profiles
from gateway.cli import main

GB = 10**9
BASE = {
    "name": "t",
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "max_model_len": 4096,
    "tensor_parallel_size": 4,
    "gpu": {"kind": "h100-80gb", "count": 4, "usd_per_hour": "2.49"},
}


def profile(**over: object) -> object:
    return parse_profile({**BASE, **over})


# ----------------------------------------------------------------------------- planner
def test_golden_llama_70b_fp16_kv_per_4096_token_sequence_is_1_34_gb() -> None:
    arch = planner.architecture("meta-llama/Llama-3.1-70B-Instruct")
    per_token = planner.kv_bytes_per_token(arch, 2)
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert round(per_token * 4096 / GB, 2) == 1.34
    textbook = planner.textbook_kv_bytes_per_token(arch, 2) * 4096
    assert round(textbook / GB, 1) == 10.7
    assert textbook // (per_token * 4096) == 8


def test_plan_json_of_the_70b_fp8_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "plan", "llama-3.1-70b-fp8-4x80gb", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"weights_bytes", "kv_bytes_per_token", "kv_bytes_per_sequence", "max_sequences", "fits"} <= set(
        out
    )
    assert out["fits"] is True
    assert out["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 1  # fp8 KV: 1 byte
    assert out["kv_bytes_per_sequence"] == out["kv_bytes_per_token"] * 32768
    assert 70 * GB < out["weights_bytes"] < 76 * GB  # ~70.6B params at 1 byte, 16-bit embeddings
    assert out["max_sequences"] == (out["kv_budget_bytes"] // out["kv_bytes_per_sequence"])
    assert out["max_sequences"] >= 30


def test_every_shipped_profile_plans_and_fits() -> None:
    names = shipped_profiles()
    assert {"llama-3.1-8b-awq-24gb", "llama-3.1-70b-fp8-4x80gb", "qwen2.5-7b-bf16-ngram"} <= set(names)
    for name in names:
        p = planner.plan(load_profile(name))
        assert p.fits, (name, p.problem)
        assert p.recommended_max_num_seqs >= 1


def test_awq_8b_weights_are_about_a_third_of_bf16() -> None:
    arch = planner.architecture("meta-llama/Llama-3.1-8B-Instruct")
    assert round(arch.params / 1e9, 2) == 8.03
    bf16 = planner.weight_bytes(arch, "none", "bfloat16")
    awq = planner.weight_bytes(arch, "awq_marlin", "float16")
    assert round(bf16 / GB, 1) == 16.1
    assert 5.0 * GB < awq < 6.2 * GB  # int4 + group scales + 16-bit embeddings/LM head


def test_does_not_fit_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = {**BASE, "tensor_parallel_size": 1, "gpu": {"kind": "l4-24gb", "count": 1, "usd_per_hour": "0.8"}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["engine", "plan", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "weights need 141" in out and "quantize" in out
    assert main(["engine", "plan", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["fits"] is False
    assert "error: weights need" in captured.err


def test_kv_too_small_for_one_sequence_names_the_max_len() -> None:
    p = planner.plan(
        parse_profile(
            {
                **BASE,
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "max_model_len": 131072,
                "tensor_parallel_size": 1,
                "quantization": "none",
                "gpu_memory_utilization": 0.9,
                "gpu": {"kind": "l4-24gb", "count": 1, "usd_per_hour": "0.8"},
            }
        )
    )
    assert not p.fits and p.max_sequences == 0
    assert "lower max_model_len to at most" in (p.problem or "")


def test_architecture_from_a_local_config_json(tmp_path: Path) -> None:
    cfg = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 256, "vocab_size": 1024, "tie_word_embeddings": True, "head_dim": 32}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = planner.architecture(str(tmp_path))
    assert arch.source.endswith("config.json")
    assert planner.kv_bytes_per_token(arch, 2) == 2 * 2 * 2 * 32 * 2


def test_unknown_model_and_gpu_are_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(planner.PlanError, match="unknown architecture"):
        planner.architecture("someone/mystery-model")
    assert main(["engine", "plan", "qwen2.5-7b-bf16-ngram", "--gpu", "tpu-v9"]) == 2
    assert "unknown GPU 'tpu-v9'" in capsys.readouterr().err
    assert main(["engine", "plan", "qwen2.5-7b-bf16-ngram", "--gpu", "h100-80gb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == "h100-80gb"


# ----------------------------------------------------------------------------- profiles
def test_profile_schema_rejects_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile({**BASE, "max_model_lenn": 10, "quantization": "int3", "gpu_memory_utilization": 1.5})
    paths = {p for p, _ in err.value.problems}
    assert {"max_model_lenn", "quantization", "gpu_memory_utilization"} <= paths
    with pytest.raises(ProfileError, match="must equal tensor_parallel_size"):
        parse_profile({**BASE, "tensor_parallel_size": 2})
    with pytest.raises(ProfileError, match="cannot run on CPU: set gpu_only: true"):
        parse_profile({**BASE, "quantization": "awq_marlin"})
    with pytest.raises(ProfileError, match="needs 'model'"):
        parse_profile({**BASE, "speculative": {"method": "eagle", "num_speculative_tokens": 3}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(bad))
    with pytest.raises(ProfileError, match="shipped profiles: "):
        load_profile("no-such-profile")


def test_gpu_only_profiles_are_marked() -> None:
    marked = {n for n in shipped_profiles() if load_profile(n).gpu_only}
    assert {"llama-3.1-8b-awq-24gb", "llama-3.1-70b-fp8-4x80gb", "llama-3.1-8b-eagle-h100"} <= marked
    assert "qwen2.5-7b-bf16-ngram" not in marked


# ----------------------------------------------------------------------------- launcher (dry run)
def test_dry_run_commands_of_gpu_only_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "serve", "llama-3.1-70b-fp8-4x80gb", "--dry-run", "--json", "--python", "py"]) == 0
    out = json.loads(capsys.readouterr().out)
    cmd = out["command"]
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--quantization"] == "fp8" and pairs["--kv-cache-dtype"] == "fp8"
    assert pairs["--tensor-parallel-size"] == "4" and pairs["--max-model-len"] == "32768"
    assert "--enable-prompt-tokens-details" in cmd and "--enable-prefix-caching" in cmd
    assert out["gpu_only"] is True

    eagle = launcher.command(load_profile("llama-3.1-8b-eagle-h100"), "py")
    spec = json.loads(eagle[eagle.index("--speculative-config") + 1])
    assert spec == {
        "method": "eagle",
        "num_speculative_tokens": 3,
        "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    }
    awq = launcher.command(load_profile("llama-3.1-8b-awq-24gb"), "py")
    assert awq[awq.index("--quantization") + 1] == "awq_marlin"

    assert main(["engine", "serve", "qwen2.5-7b-bf16-ngram", "--dry-run", "--port", "9001"]) == 0
    line = capsys.readouterr().out
    assert '"method":"ngram"' in line and "--port 9001" in line


# ----------------------------------------------------------------------------- prices
def test_price_per_1m_is_gpu_dollars_over_throughput() -> None:
    # $2.49/h at 1,000 tokens/s: 2.49 / 3.6e6 x 1e6 = $0.691667 per 1M
    assert calibration.price_per_1m(Decimal("2.49"), 1000.0) == Decimal("0.691667")
    doc = calibration.calibration(load_profile("llama-3.1-70b-fp8-4x80gb"), 8000.0, 1200.0, 40000.0)
    assert doc["gpu"] == "4xh100-80gb" and doc["gpu_usd_per_hour"] == "9.96"
    prices = doc["price_usd_per_1m"]
    assert prices["input"] == str(calibration.price_per_1m(Decimal("9.96"), 8000.0)) == "0.345833"
    assert prices["output"] == "2.305556"
    assert Decimal(prices["cached_input"]) < Decimal(prices["input"])
    assert set(doc) == {"profile", "gpu", "gpu_usd_per_hour", "prompt_tokens_per_s",
                        "generation_tokens_per_s", "price_usd_per_1m", "measured_at"}  # fmt: skip


def test_breakeven_table_is_computed(capsys: pytest.CaptureFixture[str]) -> None:
    api = be.ApiPrice(Decimal("0.25"), Decimal("2.00"))
    rows = be.table([10**5, 10**6, 10**7, 10**8, 10**9], usd_per_hour=Decimal("0.80"), prompt_tps=3000.0,
                    gen_tps=600.0, api=api)  # fmt: skip
    assert [r.cheaper for r in rows] == ["api", "api", "api", "self-hosted", "self-hosted"]
    assert rows[0].self_hosted_usd_per_month == Decimal("584.00")  # one always-on replica, 730 h
    # 1M tokens/day, 25% output: (0.75 x 0.25 + 0.25 x 2.00) x 30.4167 days
    assert rows[1].api_usd_per_month == Decimal("20.91")
    assert rows[4].replicas > 1
    even = be.breakeven_tokens_per_day(usd_per_hour=Decimal("0.80"), api=api, output_share=0.25)
    assert even == round(584 / (0.6875 * 30.4167) * 1e6)  # $584 / ($0.6875 x 30.4167 days per 1M/day)
    assert main(["engine", "breakeven", "llama-3.1-8b-awq-24gb", "--prompt-tps", "3000", "--gen-tps", "600",
                 "--api-input", "0.25", "--api-output", "2.00", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["breakeven_tokens_per_day"] == even
    assert next(r["cheaper"] for r in out["rows"]) == "api"
    assert (
        main(["engine", "breakeven", "llama-3.1-8b-awq-24gb", "--api-input", "1", "--api-output", "2"]) == 2
    )
    assert "--calibration" in capsys.readouterr().err
    assert main(["engine", "breakeven", "llama-3.1-8b-awq-24gb", "--prompt-tps", "1", "--gen-tps", "1",
                 "--api-input", "x", "--api-output", "2"]) == 2  # fmt: skip
    assert "not a number" in capsys.readouterr().err


def test_parse_volume() -> None:
    assert be.parse_volume("10M") == 10**7 and be.parse_volume("500k") == 500_000
    assert be.parse_volume("1e6") == 10**6 and be.parse_volume("2B") == 2 * 10**9
    with pytest.raises(ValueError):
        be.parse_volume("-1")


def test_profiles_dir_holds_only_valid_yaml() -> None:
    for path in PROFILE_DIR.glob("*.yaml"):
        assert load_profile(str(path)).name == path.stem
