"""CPU cost of rate-limit and budget bookkeeping per request (a micro-benchmark).

`python -m load_tests.limits_bench [--n 50000] [--out DIR]` times, with ``time.process_time``
(CPU, this thread's process), the calls the pipeline makes per request for limits, in
process (no Redis), for several configurations, and writes JSON and Markdown to DIR:

- ``off``: no limit configured (what every request pays when limits are not used)
- ``rpm``: tenant rpm + key rpm (one atomic check of two buckets)
- ``budgets``: tenant daily+monthly and route daily budgets: reserve (tokenizer count of the
  prompt + worst case) and settle to the real cost
- ``budgets+rpm+tpm``: everything at once, including the tokens-per-minute debit
- ``redis``: the same as the last one with Redis, when Redis is reachable, both ways the
  gate can be driven: ``one_trip`` (what the pipeline does: ``admit`` with the budget
  candidates, ``reserve(held=...)``, ``finish``: one awaited script and one in the background)
  and ``separate`` (``admit``, ``reserve``, ``record_tokens``, ``settle``: four scripts, as
  before). Per request: CPU µs (this process, the redis client included), median wall time
  until the admission is answered, and scripts sent (counted with MONITOR on the bench's key
  prefix, so other clients of the same Redis do not count)

The issue's target: ledger + budget bookkeeping <= 0.1 ms CPU per request at 3,000 req/s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from gateway.limits.gate import Limits
from gateway.limits.keys import KeyLimits
from gateway.limits.plans import Candidate

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


async def _one_trip(limits: Limits, policy: Policy, cand: list[Candidate]) -> None:
    held = await limits.admit(policy, "t", "k", body=BODY, candidates=cand)
    _, res = await limits.reserve(policy, "t", "k", BODY, cand, held=held)
    limits.finish(policy, "k", 120, res, COST)


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
        results["redis"] = await _redis(redis_url, cand, min(n, 2000))
    return results


async def _noop_async(_: object) -> None:
    return None


class ScriptCounter:
    """Counts the commands clients send to Redis on keys under ``prefix`` (MONITOR): the round
    trips a workload costs, whatever else shares the server."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio as aioredis

        self._client: Any = aioredis.Redis.from_url(url, decode_responses=True)
        self.prefix = prefix
        self.count = 0
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def _listen(self) -> None:
        async with self._client.monitor() as mon:
            self._ready.set()
            while True:
                cmd = await mon.next_command()
                if cmd.get("client_type") != "lua" and self.prefix in cmd.get("command", ""):
                    self.count += 1

    async def __aenter__(self) -> ScriptCounter:
        self._task = asyncio.create_task(self._listen())
        await asyncio.wait_for(self._ready.wait(), 5.0)
        await asyncio.sleep(0.05)
        return self

    async def settle(self, expected: int, timeout: float = 5.0) -> int:
        """Wait (bounded) until at least ``expected`` commands were seen; the count."""
        deadline = time.monotonic() + timeout
        while self.count < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and a little longer, for any stragglers
        return self.count

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        await self._client.aclose()


async def _redis_way(
    url: str, cand: list[Candidate], n: int, fn: Callable[[Limits, Policy, list[Candidate]], Awaitable[None]]
) -> dict[str, Any] | str:
    from gateway.limits.redis_store import RedisStore

    prefix = f"bench:{uuid.uuid4().hex}:"
    store = RedisStore(url, prefix, 1.0)
    if not await store.ping():
        await store.aclose()
        return "unreachable"
    policy = _policy(True, True)
    owner = TaskOwner()
    limits = Limits(
        store, prompt_tokens=prompt_tokens, key_limits=lambda: {"k": KeyLimits()}, spawn=owner.spawn
    )
    for _ in range(20):  # warm: scripts loaded, connections open
        await fn(limits, policy, cand)
    await asyncio.sleep(0.2)
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await fn(limits, policy, cand)
        walls.append(time.perf_counter() - t0)
    await asyncio.gather(*limits._tasks, return_exceptions=True)
    cpu = (time.process_time() - cpu0) / n * 1e6
    counted = min(n, 200)  # a separate pass: parsing MONITOR's stream costs this process CPU
    async with ScriptCounter(url, prefix) as counter:
        for _ in range(counted):
            await fn(limits, policy, cand)
        await asyncio.gather(*limits._tasks, return_exceptions=True)
        sent = await counter.settle(counted)
    await limits.aclose()
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis.from_url(url)
    keys = [k async for k in client.scan_iter(match=prefix + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    return {
        "cpu_us_incl_client": round(cpu, 1),
        "wall_p50_us": round(statistics.median(walls) * 1e6, 1),
        "scripts_per_request": round(sent / counted, 2),
    }


async def _redis(url: str, cand: list[Candidate], n: int) -> dict[str, Any] | str:
    """Both ways, alternated three times; medians."""
    runs: dict[str, list[dict[str, Any]]] = {"one_trip": [], "separate": []}
    for _ in range(3):
        for name, fn in (("one_trip", _one_trip), ("separate", _one)):
            result = await _redis_way(url, cand, n, fn)
            if isinstance(result, str):
                return result
            runs[name].append(result)
    out: dict[str, Any] = {}
    for name, results in runs.items():
        out[name] = {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
    out["cpu_ratio_one_trip_vs_separate"] = round(
        out["one_trip"]["cpu_us_incl_client"] / out["separate"]["cpu_us_incl_client"], 3
    )
    return out


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
    lines += [f"| {k} | {v} |" for k, v in results.items() if k != "redis"]
    redis_result = results.get("redis")
    if isinstance(redis_result, dict):
        lines += ["", "Redis (medians of 3 alternated runs):", ""]
        lines += ["| way | CPU µs / request | wall p50 µs | scripts / request |", "| --- | --- | --- | --- |"]
        for way in ("one_trip", "separate"):
            r = redis_result[way]
            lines.append(
                f"| {way} | {r['cpu_us_incl_client']} | {r['wall_p50_us']} | {r['scripts_per_request']} |"
            )
        lines += ["", f"CPU one_trip / separate: {redis_result['cpu_ratio_one_trip_vs_separate']}"]
    elif redis_result is not None:
        lines += ["", f"Redis: {redis_result}"]
    md = f"# Limits bookkeeping, {stamp}\n\n{args.n} iterations, in process.\n\n" + "\n".join(lines) + "\n"
    (args.out / f"limits-{stamp}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
