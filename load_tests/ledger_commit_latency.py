"""Commit latency of the durable ledger: WAL checkpoints inside commits vs in the background.

``python -m load_tests.ledger_commit_latency [--rate 300] [--rows 3000] [--runs 3]``

Paced like an open-loop gateway: one row submitted every 1/rate s, each awaited the way a
request awaits its row (``SQLiteLedger.submit``), through the real writer thread, with the
checkpoints either SQLite's automatic ones (inside the commit that crosses 1000 WAL pages) or
the ledger's background checkpointer (``gateway/ledger/checkpoint.py``), alternated in the same
run. Reports per mode the commit time (``_insert``) p50/p99/max, the submit-to-committed wait
p50/p99 (what a request's latency carries) and the WAL file's size at the end. JSON + Markdown
to ``load_tests/reports/ledger-commit-*``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.store import SQLiteLedger
from load_tests.report_files import bench_parser, save_report

MODES = {"background": True, "inline": False}


def _row(i: int) -> LedgerRow:
    return LedgerRow(
        request_id=f"commit-{i}",
        ts=time.time(),
        tenant="bench",
        key_id="0123456789ab",
        route="bench",
        requested_model="bench",
        served_model="gpt-4o-mini",
        provider="openai",
        endpoint="chat",
        stream=False,
        cache_status="miss",
        input_tokens=1200,
        cached_tokens=1000,
        cache_write_tokens=0,
        output_tokens=300,
        usage_estimated=False,
        cost_usd=Decimal("0.0002850000"),
        baseline_cost_usd=Decimal("0.0060000000"),
        latency_ms=1.0,
        ttft_ms=None,
        status="ok",
        http_status=200,
        error_code=None,
        attempts=1,
        classifier_score=None,
        savings_cause="routing",
        route_decision="bench",
        conversation="0123456789abcdef",
    )


class _TimedLedger(SQLiteLedger):
    """The real ledger, timing each transaction of its writer thread."""

    def __init__(self, path: Path, background: bool) -> None:
        super().__init__(path, background_checkpoints=background)
        self.commit_s: list[float] = []

    def _insert(self, batch: list[LedgerRow]) -> None:
        started = time.perf_counter()
        super()._insert(batch)
        self.commit_s.append(time.perf_counter() - started)


def _q(xs: list[float], p: float) -> float:
    ordered = sorted(xs)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000, 3)


async def _paced(ledger: SQLiteLedger, rate: float, rows: int) -> list[float]:
    waits: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        if not await ledger.submit(_row(i)):
            raise RuntimeError("a row was not committed")
        waits.append(time.perf_counter() - started)

    tasks = []
    t0 = time.perf_counter()
    for i in range(rows):
        tasks.append(asyncio.create_task(one(i)))
        delay = t0 + (i + 1) / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
    return waits


def run_mode(mode: str, rate: float, rows: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sy-commit-") as tmp:
        path = Path(tmp) / "ledger.db"
        ledger = _TimedLedger(path, MODES[mode])
        ledger.start()
        try:
            waits = asyncio.run(_paced(ledger, rate, rows))
            wal = path.with_name(path.name + "-wal")
            wal_mb = round(wal.stat().st_size / 1e6, 1) if wal.exists() else 0.0
        finally:
            ledger.close()
        commits = ledger.commit_s
    return {
        "mode": mode,
        "commits": len(commits),
        "commit_p50_ms": _q(commits, 0.5),
        "commit_p99_ms": _q(commits, 0.99),
        "commit_max_ms": round(max(commits) * 1000, 2),
        "commits_over_2ms": sum(1 for c in commits if c > 0.002),
        "wait_p50_ms": _q(waits, 0.5),
        "wait_p99_ms": _q(waits, 0.99),
        "wal_mb": wal_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, seconds=None)
    parser.add_argument("--rate", type=float, default=300.0, help="rows submitted per second")
    parser.add_argument("--rows", type=int, default=3000)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(max(1, args.runs)):
        for mode in MODES:
            results[mode].append(run_mode(mode, args.rate, max(1, args.rows)))
    keys = [k for k in results["inline"][0] if k != "mode"]
    medians = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in results.items()}
    lines = [
        f"# Ledger commit latency at {args.rate:g} rows/s ({args.rows} rows, medians of {args.runs} runs)",
        "",
        "| measure | checkpoints inside commits (SQLite's) | background checkpointer |",
        "| --- | ---: | ---: |",
        *(f"| {k} | {medians['inline'][k]} | {medians['background'][k]} |" for k in keys),
    ]
    save_report(args.out, "ledger-commit", {"runs": results, "medians": medians}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
