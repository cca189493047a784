"""The conversation spans (``SWITCHYARD_CONVERSATION_SPANS=1``): what they cost a row, how
long turning them on takes, and the top 20 conversations with and without them.

    python -m load_tests.ledger_spans_bench [--rows 10000000] [--write-rows 20000] [--pg URL | --no-pg]

- Writer CPU per row (SQLite, the writer thread included): rows with 100k conversations through
  ``SQLiteLedger.write`` + ``flush``, spans off and on, alternated, median of 3.
- A month of ``--rows`` rows seeded into each store (``ledger_seed``), the top 20 conversations
  of the last 1, 3, 7 and 30 days timed from the plain ranking, then the spans turned on (the
  back-fill timed) and the same reports timed again, their answers compared with the plain
  ranking's. Target: the 30-day report < 100 ms on both stores.

Writes ``ledger-spans-<UTC>.json`` and ``.md`` under ``load_tests/reports/``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import pg_spans_state
from gateway.ledger.report import spend
from gateway.ledger.store import SQLiteLedger
from load_tests import ledger_seed
from load_tests.ledger_bench import make_rows, timed
from load_tests.report_files import save_report

DAY = 86_400.0
WINDOWS = {"day": DAY, "3 days": 3 * DAY, "7 days": 7 * DAY, "30 days": 30 * DAY}


def writer_cpu(n: int, workdir: Path) -> dict[str, float]:
    """Process CPU (all threads) per row written and committed, spans off and on."""
    end = time.time()
    rnd = random.Random(3)
    base = make_rows(n, end)
    out: dict[str, list[float]] = {"off": [], "on": []}
    for run in range(3):
        for keep in (False, True):
            rows = [
                replace(
                    r, request_id=f"{r.request_id}-{run}-{keep}", conversation=f"{rnd.getrandbits(60):015x}"
                )
                for r in base
            ]
            led = SQLiteLedger(workdir / f"w{run}{keep}.db", conversation_spans=keep)
            led.start()
            cpu0 = time.process_time()
            for r in rows:
                led.write(r)
            assert led.flush(120)
            out["on" if keep else "off"].append((time.process_time() - cpu0) / n * 1e6)
            led.close()
    return {k: round(statistics.median(v), 1) for k, v in out.items()}


def _tops(url: str | Path, end: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, seconds in WINDOWS.items():

        def report(since: float = seconds) -> Any:
            return spend(url, "conversation", since, now=end, top=20)

        out[name] = timed(report, repeat=3)
    return out


def _with_spans(url: str | Path, end: float, turn_on: Any) -> dict[str, Any]:
    plain = _tops(url, end)
    t0 = time.perf_counter()
    turn_on()
    backfill_s = round(time.perf_counter() - t0, 1)
    fast = _tops(url, end)
    for name, seconds in WINDOWS.items():
        answer = spend(url, "conversation", seconds, now=end, top=20)
        fast[name]["exact"] = answer == spend(url, "conversation", seconds, now=end, top=20, rollups=False)
    return {"plain": plain, "spans": fast, "backfill_s": backfill_s}


def _sqlite_on(path: Path) -> None:
    led = SQLiteLedger(path, conversation_spans=True)
    led.start()  # the start-up back-fill
    led.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--write-rows", type=int, default=20_000)
    parser.add_argument(
        "--pg", default=os.environ.get("SWITCHYARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "reports")
    args = parser.parse_args(argv)
    end = time.time()
    result: dict[str, Any] = {"rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="sy-spans-") as tmp:
        work = Path(tmp)
        if args.write_rows > 0:
            result["writer_cpu_us_per_row"] = writer_cpu(args.write_rows, work)
            print("writer CPU per row:", result["writer_cpu_us_per_row"], flush=True)
        path = work / "reports.db"
        ledger_seed.seed_sqlite(path, args.rows, end)
        result["sqlite"] = _with_spans(path, end, lambda: _sqlite_on(path))
        print("SQLite:", result["sqlite"], flush=True)
    if not args.no_pg:
        schema = f"sy_spans_{uuid.uuid4().hex[:8]}"
        admin = pg_connect(args.pg)
        admin.autocommit = True
        admin.execute(f"CREATE SCHEMA {schema}")
        url = f"{args.pg}{'&' if '?' in args.pg else '?'}options=-csearch_path%3D{schema}"
        try:
            with pg_connect(url) as pg:
                ledger_seed.seed_postgres(pg, args.rows, end)

            def pg_on() -> None:
                with pg_connect(url) as pg:
                    pg_spans_state(pg, True)

            result["postgres"] = _with_spans(url, end, pg_on)
            print("PostgreSQL:", result["postgres"], flush=True)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
            admin.close()
    lines = [
        f"# Conversation spans ({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}), {args.rows:,} rows",
        "",
    ]
    cpu = result.get("writer_cpu_us_per_row")
    if cpu is not None:
        lines += [f"Writer CPU per row (SQLite): spans off {cpu['off']} µs, on {cpu['on']} µs.", ""]
    lines += ["| store | window | plain ranking | with spans | exact |", "| --- | --- | ---: | ---: | --- |"]
    for store in ("sqlite", "postgres"):
        if store in result:
            r = result[store]
            for name in WINDOWS:
                lines.append(
                    f"| {store} | {name} | {r['plain'][name]['median_ms']} ms | "
                    f"{r['spans'][name]['median_ms']} ms | {r['spans'][name]['exact']} |"
                )
            lines.append(f"| {store} | back-fill | {r['backfill_s']} s | | |")
    save_report(args.out, "ledger-spans", result, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
