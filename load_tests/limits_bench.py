"""CPU cost of rate-limit and budget bookkeeping per request (a micro-benchmark).

`python -m load_tests.limits_bench [--n 50000] [--out DIR]` times, with ``time.process_time``
(CPU, this thread's process), the calls the pipeline makes per request for limits, in
process (no Redis), for several configurations, and writes JSON and Markdown to DIR:

- ``off``: no limit configured (what every request pays when limits are not used)
- ``rpm``: tenant rpm + key rpm (one atomic check of two buckets)
- ``budgets``: tenant daily+monthly and route daily budgets: reserve (tokenizer count of the
  prompt + worst case) and settle to the real cost
- ``budgets+rpm+tpm``: everything at once, including the tokens-per-minute debit
- ``redis``: the same as the last one with Redis (median wall time of one round trip
  admit + reserve; the settle is off the request path), when Redis is reachable

The issue's target: ledger + budget bookkeeping <= 0.1 ms CPU per request at 3,000 req/s."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.bootstrap import prompt_tokens
from gateway.config.policy import Policy
from gateway.core.types import Price
from gateway.flow.services import TaskOwner
from gateway.limits.gate import Candidate, Limits
from gateway.limits.keys import KeyLimits

BODY = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Summarise the plot of Hamlet in two lines."}],
}
PRICE = Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"))
COST = Decimal("0.0000123456")


def _policy(rpm: bool, budgets: bool) -> Policy:
    tenant: dict[str, Any] = {}
    route: dict[str, Any] = {"targets": ["m"]}
    limits: dict[str, Any] = {}
    if rpm:
        tenant["rpm"] = 10**9
        limits = {"key_rpm": 10**9, "key_tpm": 10**12}
    if budgets:
        tenant["budget"] = {"daily_usd": 10**6, "monthly_usd": 10**7}
        route["budget"] = {"daily_usd": 10**6}
    return Policy.model_validate(
        {
            "providers": {"p": {"type": "openai", "base_url": "http://x", "key_required": False}},
            "models": {"m": {"provider": "p", "price": {"input": "0.15", "output": "0.60"}}},
            "routes": {"auto": route},
            "tenants": {"t": tenant},
            "limits": limits,
        }
    )


async def _one(limits: Limits, policy: Policy, cand: list[Candidate]) -> None:
    await limits.admit(policy, "t", "k")
    _, res = await limits.reserve(policy, "t", "k", BODY, cand)
    limits.record_tokens(policy, "k", 120)
    limits.settle(res, COST)


async def _cpu_us(fn: Callable[[], Awaitable[None]], n: int) -> float:
    for _ in range(1000):
        await fn()
    t0 = time.process_time()
    for _ in range(n):
        await fn()
    return (time.process_time() - t0) / n * 1e6


async def run(n: int, redis_url: str | None) -> dict[str, Any]:
    cand = [Candidate("auto", (PRICE,), 256, "gpt-4o-mini")]
    results: dict[str, Any] = {}
    for name, rpm, budgets in (
        ("off", False, False),
        ("rpm", True, False),
        ("budgets", False, True),
        ("budgets+rpm+tpm", True, True),
    ):
        policy = _policy(rpm, budgets)
        limits = Limits(
            prompt_tokens=prompt_tokens, key_limits=lambda: {"k": KeyLimits()}, spawn=TaskOwner().spawn
        )
        results[name] = round(await _cpu_us(lambda: _one(limits, policy, cand), n), 2)  # noqa: B023
    results["tokenizer_count_only"] = round(
        await _cpu_us(lambda: _noop_async(prompt_tokens(BODY, "gpt-4o-mini")), n), 2
    )
    if redis_url:
        results["redis"] = await _redis(redis_url, cand, min(n, 5000))
    return results


async def _noop_async(_: object) -> None:
    return None


async def _redis(url: str, cand: list[Candidate], n: int) -> dict[str, Any] | str:
    from gateway.limits.redis_store import RedisStore

    store = RedisStore(url, f"bench:{uuid.uuid4().hex}:", 1.0)
    if not await store.ping():
        await store.aclose()
        return "unreachable"
    policy = _policy(True, True)
    limits = Limits(
        store, prompt_tokens=prompt_tokens, key_limits=lambda: {"k": KeyLimits()}, spawn=TaskOwner().spawn
    )
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await _one(limits, policy, cand)
        walls.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / n * 1e6
    await limits.aclose()
    return {
        "wall_p50_us": round(statistics.median(walls) * 1e6, 1),
        "cpu_us_incl_client": round(cpu, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="'' to skip")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "reports")
    args = parser.parse_args()
    results = asyncio.run(run(args.n, args.redis or None))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"benchmark": "limits_bench", "when": stamp, "iterations": args.n, "cpu_us_per_request": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"limits-{stamp}.json").write_text(json.dumps(report, indent=2))
    lines = ["| configuration | CPU µs / request |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in results.items()]
    md = f"# Limits bookkeeping, {stamp}\n\n{args.n} iterations, in process.\n\n" + "\n".join(lines) + "\n"
    (args.out / f"limits-{stamp}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
