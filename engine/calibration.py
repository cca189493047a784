"""Measure a running engine's prompt and generation throughput and turn it into a price per 1M
tokens: GPU $/hour / (3600 x tokens/s) x 1e6. The calibration file is what the gateway's
ledger reads through ``models.X.price_calibration`` in the policy.

Three phases, each ``requests`` requests at ``concurrency`` in flight:
  prefill  unique prompts of ~prompt_tokens, max_tokens=1 -> prompt (uncached) tokens/s
  cached   the same prompts again (prefix cache hits)     -> cached prompt tokens/s
  decode   short unique prompts, output_tokens each, ignore_eos -> generation tokens/s
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import aiohttp

from engine.profiles import Profile

WORDS = (
    "river",
    "stone",
    "cloud",
    "ledger",
    "engine",
    "signal",
    "harbor",
    "copper",
    "window",
    "garden",
    "meadow",
    "lantern",
    "orbit",
    "canvas",
    "thunder",
    "pepper",
    "silver",
    "bridge",
    "forest",
    "violet",
    "marble",
    "rocket",
    "tunnel",
    "anchor",
)


@dataclass(frozen=True, slots=True)
class PhaseResult:
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    seconds: float


def price_per_1m(usd_per_hour: Decimal, tokens_per_s: float) -> Decimal:
    if tokens_per_s <= 0:
        raise ValueError("throughput must be positive")
    tps = Decimal(repr(tokens_per_s))
    return (usd_per_hour * Decimal(1_000_000) / (Decimal(3600) * tps)).quantize(
        Decimal("0.000001"), rounding=ROUND_HALF_UP
    )


def calibration(
    profile: Profile, prompt_tps: float, gen_tps: float, cached_prompt_tps: float | None
) -> dict[str, Any]:
    """The calibration document (the format the ledger's loader reads)."""
    usd = profile.usd_per_hour
    cached = price_per_1m(usd, cached_prompt_tps) if cached_prompt_tps else price_per_1m(usd, prompt_tps)
    return {
        "profile": profile.name,
        "gpu": f"{profile.gpu.count}x{profile.gpu.kind}" if profile.gpu.count > 1 else profile.gpu.kind,
        "gpu_usd_per_hour": str(usd),
        "prompt_tokens_per_s": round(prompt_tps, 3),
        "generation_tokens_per_s": round(gen_tps, 3),
        "price_usd_per_1m": {
            "input": str(price_per_1m(usd, prompt_tps)),
            "cached_input": str(min(cached, price_per_1m(usd, prompt_tps))),
            "output": str(price_per_1m(usd, gen_tps)),
        },
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def synthetic_prompt(n_words: int, seed: str) -> str:
    body = " ".join(WORDS[(i * 7 + len(seed)) % len(WORDS)] for i in range(n_words))
    return f"[{seed}] {body}"


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url, json=body) as resp:
        data: dict[str, Any] = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"engine answered HTTP {resp.status}: {str(data)[:200]}")
        return data


async def run_phase(
    base_url: str, model: str, prompts: list[str], max_tokens: int, concurrency: int, timeout_s: float
) -> PhaseResult:
    url = base_url.rstrip("/") + "/chat/completions"
    sem = asyncio.Semaphore(concurrency)
    totals = [0, 0, 0]

    async def go(session: aiohttp.ClientSession, prompt: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # vLLM: always generate max_tokens
        }
        async with sem:
            data = await _one(session, url, body)
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        totals[0] += int(usage.get("prompt_tokens") or 0)
        totals[1] += int(details.get("cached_tokens") or 0)
        totals[2] += int(usage.get("completion_tokens") or 0)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(go(session, p) for p in prompts))
        seconds = time.perf_counter() - t0
    return PhaseResult(len(prompts), totals[0], totals[1], totals[2], seconds)


async def first_model(base_url: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(base_url.rstrip("/") + "/models") as resp,
    ):
        data = await resp.json()
    return str(data["data"][0]["id"])


@dataclass(frozen=True, slots=True)
class BenchResult:
    prefill: PhaseResult
    cached: PhaseResult
    decode: PhaseResult

    @property
    def prompt_tps(self) -> float:
        p = self.prefill
        return (p.prompt_tokens - p.cached_tokens) / p.seconds

    @property
    def cached_prompt_tps(self) -> float:
        return self.cached.prompt_tokens / self.cached.seconds

    @property
    def generation_tps(self) -> float:
        return self.decode.completion_tokens / self.decode.seconds


async def bench(
    base_url: str,
    model: str | None,
    *,
    requests: int,
    concurrency: int,
    prompt_words: int,
    output_tokens: int,
    timeout_s: float = 600.0,
) -> BenchResult:
    model = model or await first_model(base_url)
    run = uuid.uuid4().hex[:8]
    prompts = [synthetic_prompt(prompt_words, f"{run}-{i}") for i in range(requests)]
    prefill = await run_phase(base_url, model, prompts, 1, concurrency, timeout_s)
    cached = await run_phase(base_url, model, prompts, 1, concurrency, timeout_s)
    short = [f"[{run}-d{i}] count" for i in range(requests)]
    decode = await run_phase(base_url, model, short, output_tokens, concurrency, timeout_s)
    return BenchResult(prefill, cached, decode)


def write_calibration(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
