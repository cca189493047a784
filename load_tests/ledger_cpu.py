"""The ledger's CPU per request: what the pipeline does for the ledger on each request (price it
twice, build the row, ``submit()`` and await the durable group commit), paced at a request
rate, as process CPU time (all threads, the writer included) less the same paced task loop
doing nothing. Run by ``python -m load_tests.ledger_bench --cpu-only``.

At 3,000 req/s rows share commits (the target, <= 0.1 ms, is for this rate); at 300 req/s
nearly every row is a commit of its own, so the per-commit cost (the transaction, the WAL
frames of each b-tree the row touches, SQLite's locks) shows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.core.ledger_row import LedgerRow
from gateway.core.types import Price, Target, Usage
from gateway.ledger.meter import savings_cause
from gateway.ledger.pricing import cost_of
from gateway.ledger.store import SQLiteLedger

RATES = (3000.0, 300.0)  # req/s: rows sharing commits, and nearly a commit per row


async def _paced(rate: float, seconds: float, inflight: int, work: Callable[[int], Any]) -> dict[str, Any]:
    """Start one task per request at ``rate`` req/s (at most ``inflight`` running), each
    awaiting ``work(i)``; process CPU time (all threads) per request."""
    sem = asyncio.Semaphore(inflight)
    n = int(rate * seconds)

    async def one(i: int) -> None:
        async with sem:
            await work(i)

    tasks = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        tasks.append(asyncio.ensure_future(one(i)))
        delay = wall0 + (i + 1) / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"requests": n, "achieved_rps": round(n / wall), "cpu_ms_per_request": round(cpu / n * 1000, 4)}


def _ledger_work(ledger: SQLiteLedger) -> Callable[[int], Any]:
    """What ``Pipeline._record`` does for the ledger on one request, then the durable wait."""
    price = Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075"))
    base = Price(Decimal("2.50"), Decimal("10.00"), Decimal("1.25"))
    target = Target("mini", "openai", "gpt-4o-mini", price)
    now = time.time()

    async def work(i: int) -> None:
        usage = Usage(1200, 300, cached_input_tokens=1000)
        cost = cost_of(usage, price)
        baseline = cost_of(Usage(usage.input_tokens, usage.output_tokens), base)
        cause = savings_cause("miss", target, cost, baseline, "large")
        row = LedgerRow(
            request_id=f"cpu-{i}",
            ts=now,
            tenant="bench",
            key_id="0123456789ab",
            route="bench",
            requested_model="bench",
            served_model=target.model,
            provider=target.provider,
            endpoint="chat",
            stream=False,
            cache_status="miss",
            input_tokens=usage.input_tokens,
            cached_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=usage.estimated,
            cost_usd=cost,
            baseline_cost_usd=baseline,
            latency_ms=1.5,
            ttft_ms=None,
            status="ok",
            http_status=200,
            error_code=None,
            attempts=1,
            classifier_score=None,
            savings_cause=cause,
            route_decision=None,
        )
        await ledger.submit(row)

    return work


async def _noop(i: int) -> None:
    await asyncio.sleep(0)  # the task still yields once, as awaiting the commit does


def bench_cpu(
    workdir: Path, rate: float = 3000.0, seconds: float = 5.0, inflight: int = 64, *, inline: bool = True
) -> dict[str, Any]:
    """CPU per request of the ledger work minus the same paced task loop doing nothing.
    ``inline=False``: every row through the writer thread (the ledger before in-place commits)."""
    led = SQLiteLedger(workdir / f"cpu-{int(rate)}-{int(inline)}.db", inline_commits=inline)
    led.start()
    try:
        with_ledger = asyncio.run(_paced(rate, seconds, inflight, _ledger_work(led)))
        in_place = led.inline_commits
    finally:
        led.close()
    baseline = asyncio.run(_paced(rate, seconds, inflight, _noop))
    added = with_ledger["cpu_ms_per_request"] - baseline["cpu_ms_per_request"]
    return {
        "rate_rps": rate,
        "inline_commits": inline,
        "rows_committed_in_place": in_place,
        "with_ledger": with_ledger,
        "task_loop_only": baseline,
        "ledger_cpu_ms_per_request": round(added, 4),
        "target_ms": 0.1,
    }


def bench_rates(workdir: Path, rates: tuple[float, ...] = RATES, seconds: float = 5.0) -> dict[str, Any]:
    """``bench_cpu`` at each rate, as shipped and with every row through the writer thread, in
    turn; the first rate's shipped figures at the top level (the target's)."""
    runs = [bench_cpu(workdir, rate, seconds, inline=inline) for rate in rates for inline in (True, False)]
    return {**runs[0], "by_rate": runs}
