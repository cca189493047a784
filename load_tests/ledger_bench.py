"""Ledger benchmark: 1M rows into SQLite and PostgreSQL, then the spend queries timed; and the
ledger's CPU cost per request at 3,000 req/s.

    python -m load_tests.ledger_bench [--rows 1000000] [--report-rows 10000000] [--pg URL | --no-pg]
                                      [--out DIR] [--cpu-only] [--reports-only]

- Ingest: SQLite through the real writer (``SQLiteLedger.write`` + group commit), rows/s.
  PostgreSQL: a sample through the real outbox + shipper (rows/s), the rest by COPY.
- Queries (median of 3, cold-ish then warm): spend by model / by tenant over the last day and
  the last 30 days, by model for one tenant, daily series by model, savings by cause, budget
  seeding (``spent_since``), on both stores.
- CPU per request (`ledger_cpu`): what the pipeline does for the ledger on each request (price it twice,
  build the row, ``submit()`` and await the group commit) at 3,000 and at 300 req/s, 64 in flight,
  measured as process CPU time (all threads, the writer included) over wall time.

- Reports at scale (``--report-rows``, default 10M): a month of rows seeded straight into
  both stores with their rollups (``ledger_seed``), then the 30-day reports timed from the
  rollups (median of 5) beside the same reports over the raw rows alone (the baseline, once
  each), whose answers must be equal to the 1e-10 USD. Target: < 100 ms on both stores.

Writes ``ledger-bench-<UTC>.json`` and ``.md`` under DIR (default load_tests/reports/).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.pg import pg_connect
from gateway.ledger.postgres import PostgresLedger, pg_migrate
from gateway.ledger.query import spent_by, spent_since
from gateway.ledger.report import savings_by_cause, spend, spend_series
from gateway.ledger.schema import COLUMNS
from gateway.ledger.store import SQLiteLedger
from load_tests import ledger_seed
from load_tests.bench_procs import machine_info
from load_tests.bench_report import save_report
from load_tests.ledger_cpu import bench_rates

DEFAULT_OUT = Path(__file__).resolve().parent / "reports"
DAY = 86_400.0
MODELS = [f"model-{i:02d}" for i in range(30)]
TENANTS = [f"tenant-{i:02d}" for i in range(20)]
ROUTES = [f"route-{i}" for i in range(10)]
KEYS = [f"key{i:09d}" for i in range(200)]
CAUSES = ["routing", "exact_cache", "semantic_cache", "self_hosted", "none"]


def make_rows(n: int, end: float, seed: int = 7) -> list[LedgerRow]:
    """``n`` rows spread over the 30 days before ``end``, in time order (as a ledger fills)."""
    rnd = random.Random(seed)
    stamps = sorted(end - rnd.random() * 30 * DAY for _ in range(n))
    rows = []
    for i in range(n):
        inp, out = rnd.randint(20, 4000), rnd.randint(1, 1000)
        cost = Decimal(rnd.randint(0, 50_000_000)).scaleb(-10)
        rows.append(
            LedgerRow(
                request_id=f"bench-{i:09d}",
                ts=stamps[i],
                tenant=rnd.choice(TENANTS),
                key_id=rnd.choice(KEYS),
                route=rnd.choice(ROUTES),
                requested_model="auto",
                served_model=rnd.choice(MODELS),
                provider="openai",
                endpoint="chat",
                stream=bool(i & 1),
                cache_status="miss",
                input_tokens=inp,
                cached_tokens=None,
                cache_write_tokens=None,
                output_tokens=out,
                usage_estimated=False,
                cost_usd=cost,
                baseline_cost_usd=cost * 2,
                latency_ms=rnd.random() * 2000,
                ttft_ms=None,
                status="ok",
                http_status=200,
                error_code=None,
                attempts=1,
                classifier_score=None,
                savings_cause=rnd.choice(CAUSES),
            )
        )
    return rows


def timed(fn: Callable[[], Any], repeat: int = 3) -> dict[str, Any]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return {
        "median_ms": round(statistics.median(runs), 1),
        "runs_ms": [round(r, 1) for r in runs],
        "groups": len(result) if isinstance(result, (list, dict)) else 1,
    }


def queries(url: str | Path, end: float) -> dict[str, dict[str, Any]]:
    month = 30 * DAY
    return {
        "by_model_day": timed(lambda: spend(url, "model", DAY, now=end)),
        "by_tenant_day": timed(lambda: spend(url, "tenant", DAY, now=end)),
        "by_model_month": timed(lambda: spend(url, "model", month, now=end)),
        "by_tenant_month": timed(lambda: spend(url, "tenant", month, now=end)),
        "one_tenant_by_model_month": timed(lambda: spend(url, "model", month, now=end, tenant=TENANTS[3])),
        "daily_series_by_model_month": timed(lambda: spend_series(url, "model", "day", month, now=end)),
        "savings_by_cause_month": timed(lambda: savings_by_cause(url, "none", month, now=end)),
        "spent_since_tenant_month": timed(lambda: spent_since(url, "tenant", end - month)),
    }


def bench_sqlite(rows: list[LedgerRow], workdir: Path, end: float) -> dict[str, Any]:
    path = workdir / "ledger.db"
    led = SQLiteLedger(path, batch_size=5000)
    led.start()
    t0 = time.perf_counter()
    for r in rows:
        led.write(r)
    assert led.flush(timeout=3600)
    ingest = time.perf_counter() - t0
    led.close()
    size = sum(p.stat().st_size for p in workdir.glob("ledger.db*"))
    return {
        "ingest_rows_per_s": round(len(rows) / ingest),
        "ingest_s": round(ingest, 1),
        "file_mb": round(size / 1e6, 1),
        "queries": queries(path, end),
    }


def bench_postgres(rows: list[LedgerRow], base_url: str, workdir: Path, end: float) -> dict[str, Any]:
    schema = f"sy_ledger_bench_{uuid.uuid4().hex[:8]}"
    admin = pg_connect(base_url)
    admin.autocommit = True
    admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base_url else "?"
    url = f"{base_url}{sep}options=-csearch_path%3D{schema}"
    try:
        sample = min(50_000, len(rows))
        led = PostgresLedger(url, workdir / "outbox.db", batch_size=5000, ship_batch=5000, idle_interval=0.05)
        led.start()
        t0 = time.perf_counter()
        for r in rows[:sample]:
            led.write(r)
        assert led.ship_now(timeout=3600), led.ship_error
        shipped = time.perf_counter() - t0
        led.close()
        t0 = time.perf_counter()
        with pg_connect(url) as conn:
            pg_migrate(conn)
            with conn.cursor() as cur, cur.copy(f"COPY ledger ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for r in rows[sample:]:
                    copy.write_row([_pg_value(getattr(r, c)) for c in COLUMNS])
            conn.commit()
            conn.execute("ANALYZE ledger")
            conn.commit()
            size = conn.execute("SELECT pg_total_relation_size('ledger')").fetchone()
        copied = time.perf_counter() - t0
        return {
            "outbox_ship_rows_per_s": round(sample / shipped),
            "outbox_ship_sample_rows": sample,
            "copy_rows_per_s": round((len(rows) - sample) / copied) if len(rows) > sample else None,
            "table_mb": round(int(size[0]) / 1e6, 1) if size else None,
            "queries": queries(url, end),
        }
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


REPORT_TARGET_MS = 100.0


def report_queries(url: str | Path, end: float) -> dict[str, Any]:
    """The 30-day reports from the rollups (timed, median of 5) and, for three of them, over
    the raw rows alone (once: the baseline), with the answers compared."""
    month = 30 * DAY
    until = end - 3.5 * DAY  # a window with two partial edges (hours inside days)
    one_tenant = ledger_seed.TENANTS[3]
    one_key = "key000000007"
    fast: dict[str, Callable[[], Any]] = {
        "by_model_month": lambda: spend(url, "model", month, now=end),
        "by_tenant_month": lambda: spend(url, "tenant", month, now=end),
        "by_key_month": lambda: spend(url, "key", month, now=end),
        "by_route_month": lambda: spend(url, "route", month, now=end),
        "one_tenant_by_model_month": lambda: spend(url, "model", month, now=end, tenant=one_tenant),
        "daily_series_by_model_month": lambda: spend_series(url, "model", "day", month, now=end),
        "savings_by_cause_month": lambda: savings_by_cause(url, "none", month, now=end),
        "spent_since_tenant_month": lambda: spent_since(url, "tenant", end - month),
        "by_model_month_two_edges": lambda: spend(url, "model", month, now=until, until=until),
        "spent_by_key_month": lambda: spent_by(url, "key", one_key, end - month),
    }
    raw: dict[str, Callable[[], Any]] = {
        "by_model_month": lambda: spend(url, "model", month, now=end, rollups=False),
        "daily_series_by_model_month": lambda: spend_series(
            url, "model", "day", month, now=end, rollups=False
        ),
        "spent_since_tenant_month": lambda: spent_since(url, "tenant", end - month, rollups=False),
        "by_model_month_two_edges": lambda: spend(url, "model", month, now=until, until=until, rollups=False),
        "spent_by_key_month": lambda: spent_since(url, "key", end - month, rollups=False).get(one_key),
    }
    out: dict[str, Any] = {}
    for name, fn in fast.items():
        fn()  # warm the cache: the rollups are small and stay in memory on a live server
        out[name] = timed(fn, repeat=5)
    for name, fn in raw.items():
        t0 = time.perf_counter()
        slow = fn()
        out[name]["raw_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        out[name]["exact"] = slow == fast[name]()
        out[name]["speedup"] = round(out[name]["raw_ms"] / max(out[name]["median_ms"], 0.1), 1)
    out["top_conversations_day"] = timed(lambda: spend(url, "conversation", DAY, now=end, top=20), repeat=5)
    top_month = lambda: spend(url, "conversation", month, now=end, top=20)  # noqa: E731
    out["top_conversations_month"] = timed(top_month, repeat=3)
    # a tenant's (the spans serve no tenant filter: the plain ranking, index-only since v10)
    top_tenant = lambda: spend(url, "conversation", 7 * DAY, now=end, top=20, tenant=one_tenant)  # noqa: E731
    out["one_tenant_top_conversations_week"] = timed(top_tenant, repeat=3)
    return out


def bench_reports(n: int, base_url: str | None, workdir: Path, end: float) -> dict[str, Any]:
    """Seed ``n`` rows into each store (rollups from the v4 back-fill; both stores at once:
    PostgreSQL works in its own server process), then time the month's reports from the
    rollups beside the raw rows, one store after the other."""
    path = workdir / "reports.db"
    result: dict[str, Any] = {"rows": n}
    schema = f"sy_ledger_reports_{uuid.uuid4().hex[:8]}"
    admin = pg_connect(base_url) if base_url is not None else None
    url = None
    if admin is not None and base_url is not None:
        admin.autocommit = True
        admin.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in base_url else "?"
        url = f"{base_url}{sep}options=-csearch_path%3D{schema}"
    pg_seed: dict[str, Any] = {}

    def seed_pg() -> None:
        assert url is not None
        with pg_connect(url) as pg:
            pg_seed["seed"] = ledger_seed.seed_postgres(pg, n, end)
            found = pg.execute("SELECT pg_total_relation_size('ledger')").fetchone()
            pg_seed["table_mb"] = round(int(found[0]) / 1e6) if found else None

    try:
        print(f"seeding {n:,} rows", file=sys.stderr)
        pg_thread = threading.Thread(target=seed_pg, name="pg-seed")
        if url is not None:
            pg_thread.start()
        result["sqlite"] = {"seed": ledger_seed.seed_sqlite(path, n, end)}
        size = sum(p.stat().st_size for p in workdir.glob("reports.db*"))
        result["sqlite"]["file_mb"] = round(size / 1e6)
        print(f"SQLite seeded: {json.dumps(result['sqlite'])}", file=sys.stderr)
        if url is not None:
            pg_thread.join()
            if "seed" not in pg_seed:
                raise RuntimeError("seeding PostgreSQL failed (see above)")
            result["postgres"] = dict(pg_seed)
            print(f"PostgreSQL seeded: {json.dumps(pg_seed)}", file=sys.stderr)
        result["sqlite"]["queries"] = report_queries(path, end)
        print(f"SQLite reports: {json.dumps(result['sqlite']['queries'])}", file=sys.stderr)
        if url is not None:
            result["postgres"]["queries"] = report_queries(url, end)
            print(f"PostgreSQL reports: {json.dumps(result['postgres']['queries'])}", file=sys.stderr)
        return result
    finally:
        for p in workdir.glob("reports.db*"):
            p.unlink()
        if admin is not None:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
            admin.close()


def _pg_value(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v


def _render_reports(rep: dict[str, Any]) -> list[str]:
    pg_rep = rep.get("postgres", {})
    lines = [
        "",
        f"## 30-day reports over {rep['rows']:,} rows (rollups + edge rows, against the raw rows alone)",
        "",
        f"{len(ledger_seed.TENANTS)} tenants, {ledger_seed.N_KEYS} keys (each in one tenant), "
        f"{ledger_seed.N_ROUTES} routes x 3 models, {ledger_seed.CONVERSATIONS:,} conversations. "
        f"Seeding (in-database INSERT ... SELECT, then the v4 migration's back-fill): "
        f"SQLite {rep['sqlite']['seed']}, file {rep['sqlite']['file_mb']} MB; "
        f"PostgreSQL {pg_rep.get('seed')}, table {pg_rep.get('table_mb')} MB.",
        "",
        "| report | SQLite ms (median of 5) | SQLite raw ms | exact "
        "| PostgreSQL ms | PostgreSQL raw ms | exact |",
        "| --- | ---: | ---: | :-: | ---: | ---: | :-: |",
    ]
    sq = rep["sqlite"]["queries"]
    pg = rep.get("postgres", {}).get("queries", {})
    for name, res in sq.items():
        other = pg.get(name, {})
        lines.append(
            f"| {name} | {res['median_ms']} | {res.get('raw_ms', '-')} | {res.get('exact', '-')} | "
            f"{other.get('median_ms', '-')} | {other.get('raw_ms', '-')} | {other.get('exact', '-')} |"
        )
    month = [k for k in sq if "top_conversations" not in k]
    worst = max([sq[k]["median_ms"] for k in month] + [pg[k]["median_ms"] for k in month if k in pg])
    ok = "met" if worst < REPORT_TARGET_MS else "NOT met"
    lines += [
        "",
        f"Slowest 30-day report: **{worst} ms** (target < {REPORT_TARGET_MS:.0f} ms: {ok}). "
        "The top conversations are picked from the covering ts index (schema v5; v10 covers the "
        "tenant too), then summed from their rows (conversations are too many to roll up).",
    ]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Ledger benchmark ({report['started_at']})",
        "",
        f"{report['rows']:,} rows over 30 days: {len(MODELS)} models, {len(TENANTS)} tenants, "
        f"{len(KEYS)} keys, {len(ROUTES)} routes. Machine: {report['machine']['cpu_model']}, "
        f"{report['machine']['nproc']} CPUs, load at start {report['machine']['loadavg_at_start']}.",
        "",
        "| query | SQLite median ms | PostgreSQL median ms | groups |",
        "| --- | ---: | ---: | ---: |",
    ]
    if "sqlite" not in report:
        lines = lines[:-3]
    sq = report.get("sqlite", {}).get("queries", {})
    pg = report.get("postgres", {}).get("queries", {})
    for name, res in sq.items():
        pg_ms = pg.get(name, {}).get("median_ms", "-")
        lines.append(f"| {name} | {res['median_ms']} | {pg_ms} | {res['groups']} |")
    if "sqlite" in report:
        lines += ["", "Ingest:", ""]
        s = report["sqlite"]
        lines.append(
            f"- SQLite writer (group commit, rollups kept): {s['ingest_rows_per_s']:,} rows/s, "
            f"file {s['file_mb']} MB"
        )
    if "postgres" in report:
        p = report["postgres"]
        lines.append(
            f"- PostgreSQL outbox + shipper: {p['outbox_ship_rows_per_s']:,} rows/s "
            f"({p['outbox_ship_sample_rows']:,} rows); the rest by COPY; table {p['table_mb']} MB"
        )
    if "reports" in report:
        lines += _render_reports(report["reports"])
    c = report["cpu"]
    lines += [
        "",
        f"Ledger CPU per request at {c['rate_rps']:.0f} req/s (price x2, row, submit, await group commit; "
        f"process CPU incl. the writer thread, minus the same task loop without it): "
        f"**{c['ledger_cpu_ms_per_request']} ms** (target <= {c['target_ms']} ms); "
        f"achieved {c['with_ledger']['achieved_rps']} req/s.",
    ]
    lines += [
        f"- at {r['rate_rps']:.0f} req/s, "
        f"{'as shipped' if r['inline_commits'] else 'every row through the writer thread'}: "
        f"{r['ledger_cpu_ms_per_request']} ms ({r['rows_committed_in_place']:,} of "
        f"{r['with_ledger']['requests']:,} rows committed in place; "
        f"achieved {r['with_ledger']['achieved_rps']} req/s)"
        for r in c.get("by_rate", [])[1:]
    ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--pg", default=os.environ.get("SWITCHYARD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU-per-request measurement")
    parser.add_argument(
        "--report-rows", type=int, default=10_000_000, help="rows for the 30-day reports (0: skip)"
    )
    parser.add_argument("--reports-only", action="store_true", help="skip the ingest part (--rows)")
    args = parser.parse_args(argv)
    if args.cpu_only:
        with tempfile.TemporaryDirectory(prefix="sy-ledger-cpu-") as tmp:
            print(json.dumps(bench_rates(Path(tmp)), indent=2))
        return 0
    started = datetime.now(UTC)
    end = time.time()
    report: dict[str, Any] = {"started_at": started.isoformat(timespec="seconds"), "rows": args.rows}
    report["machine"] = machine_info()
    with tempfile.TemporaryDirectory(prefix="sy-ledger-bench-") as tmp:
        work = Path(tmp)
        if not args.reports_only:
            print(f"generating {args.rows:,} rows", file=sys.stderr)
            rows = make_rows(args.rows, end)
            print("SQLite", file=sys.stderr)
            report["sqlite"] = bench_sqlite(rows, work, end)
            if not args.no_pg:
                print("PostgreSQL", file=sys.stderr)
                report["postgres"] = bench_postgres(rows, args.pg, work, end)
            del rows
        if args.report_rows:
            report["reports"] = bench_reports(args.report_rows, None if args.no_pg else args.pg, work, end)
        print("CPU per request", file=sys.stderr)
        report["cpu"] = bench_rates(work)
    stem = args.out / f"ledger-bench-{started.strftime('%Y%m%dT%H%M%SZ')}"
    md = render_markdown(report)
    save_report(stem, report, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
