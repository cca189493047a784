"""Scale-out: 1, 2 and 3 gateway replicas sharing one PostgreSQL and one Redis.

`python -m load_tests.replicas_bench [--replicas 1,2,3] [--seconds 4] [--concurrency 24]
[--out DIR]` starts the mock upstream and, for each replica count, that many `switchyard
serve` processes (each its own SWITCHYARD_HOME) on a fresh PostgreSQL schema (ledger, keys,
stored Responses) and one Redis database (limits, budgets, exact cache, stickiness), with a
tenant budget and per-key rate limits on (the shared paths every request takes). Closed-loop
clients are spread evenly over the replicas. Per replica count it reports:

- requests/s served (200s over the measured window) and the error count;
- gateway CPU ms per request (all replica processes, /proc);
- Redis commands per request: every command the replicas send to the bench's Redis database,
  counted with MONITOR (one round trip is one command or one pipeline; scripts count as one);
- PostgreSQL row writes per request (inserts + updates + deletes on the bench schema's tables,
  from pg_stat_user_tables, once every row has shipped) and ledger rows per request;
- what the key watch costs PostgreSQL regardless of traffic (reads per second per replica).

Here the replicas, the clients, the mock, Redis and PostgreSQL share one small machine, so
requests/s shows the cost of sharing rather than a ceiling; the per-request figures are what
docs/replicas.md scales to a large deployment. Writes ``replicas-<UTC>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from gateway.limits.key_watch import INTERVAL_S
from load_tests.bench_procs import BenchSetupError, GatewayProcess, MockProcess, cpu_seconds, machine_info
from load_tests.loadgen import BodyFactory, LoadSpec, Report, chat_body, run_closed_loop
from load_tests.report_files import REPORTS, save_report

PG = "postgresql://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379"
ADMIN_KEY = "bench-admin-key-0123456789abcdef"
POLICY = """\
server:
  auth: keys
providers:
  mock:
    type: openai
    base_url: http://127.0.0.1:{{mock_port}}/v1
    api_key: mock-key
models:
  mock-small:
    provider: mock
    upstream: mock-small
    price: {{{{input: 0.15, cached_input: 0.075, output: 0.60}}}}
routes:
  bench:
    targets: [mock-small]
tenants:
  bench:
    budget: {{{{daily_usd: 100000}}}}
limits:
  redis_url: {redis}
  redis_prefix: "{prefix}"
  key_rpm: 10000000
  key_tpm: 1000000000
cache:
  backend: redis
  redis_url: {redis}
  ttl_s: 120
"""


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    import psycopg

    schema = f"sy_replicas_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        raise BenchSetupError(f"PostgreSQL at {PG} is needed: {exc}") from exc
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


def pg_writes(schema: str) -> tuple[int, int]:
    """(row writes on the schema's tables, ledger rows) so far."""
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables "
            "WHERE schemaname = %s",
            (schema,),
        ).fetchone()
        ledger = conn.execute(f"SELECT COUNT(*) FROM {schema}.ledger").fetchone()
    return int(row[0] if row else 0), int(ledger[0] if ledger else 0)


class RedisCommands:
    """Commands the replicas send to database ``db`` (MONITOR; a script's own calls excluded)."""

    def __init__(self, db: int) -> None:
        import redis

        self.db = db
        self.count = 0
        self.by_name: dict[str, int] = {}
        self._counting = False
        self._client = redis.Redis.from_url(REDIS, decode_responses=True)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._client.monitor() as mon:
            self._ready.set()
            for cmd in mon.listen():
                if self._stop.is_set():
                    return
                if self._counting and cmd.get("db") == self.db and cmd.get("client_type") != "lua":
                    name = str(cmd.get("command", "")).split(" ", 1)[0].upper()
                    self.count += 1
                    self.by_name[name] = self.by_name.get(name, 0) + 1

    def __enter__(self) -> RedisCommands:
        self._thread.start()
        if not self._ready.wait(5):
            raise BenchSetupError("Redis MONITOR did not start")
        return self

    def start(self) -> None:
        self._counting = True

    def stop(self) -> None:
        self._counting = False

    def __exit__(self, *exc: object) -> None:
        import redis

        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(REDIS).ping()
        self._thread.join(5)
        self._client.close()


def conversation_body(tag: str, turns: int = 5) -> BodyFactory:
    """Chat bodies of conversations (a system prompt, ``turns`` requests each): request ``i`` is
    turn ``i % turns`` of conversation ``i // turns`` (the first turn a new conversation)."""
    system = {"role": "system", "content": "You are a terse assistant."}

    def make(i: int) -> bytes:
        first = {"role": "user", "content": f"conversation {tag} {i // turns}"}
        turn = i % turns
        messages: list[dict[str, str]] = [system, first]
        if turn:
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"turn {turn}"}]
        return json.dumps({"model": "bench", "messages": messages}).encode()

    return make


async def _load(
    urls: list[str],
    key: str,
    seconds: float,
    concurrency: int,
    tag: str,
    temperature: float | None = None,
    conversations: bool = False,
) -> list[Report]:
    per = max(1, concurrency // len(urls))
    specs = [
        LoadSpec(
            url=u + "/v1/chat/completions",
            body=conversation_body(f"{tag}-{i}")
            if conversations
            else chat_body("bench", tag=f"{tag}-{i}", temperature=temperature),
            headers={"authorization": f"Bearer {key}"},
            duration_s=seconds,
        )
        for i, u in enumerate(urls)
    ]
    return list(await asyncio.gather(*(run_closed_loop(s, per) for s in specs)))


def run_one(
    n: int,
    mock_port: int,
    seconds: float,
    concurrency: int,
    db: int,
    work: Path,
    temperature: float | None,
    conversations: bool = False,
    root: Path | None = None,
) -> dict[str, Any]:
    prefix = f"sybench-{uuid.uuid4().hex[:8]}:"
    redis_url = f"{REDIS}/{db}"
    policy = POLICY.format(redis=redis_url, prefix=prefix)
    with pg_schema() as schema:
        ledger = f"{PG}?options=-csearch_path%3D{schema}"
        gateways: list[GatewayProcess] = []
        try:
            key = ""
            for i in range(n):
                home = work / f"n{n}-r{i}"
                home.mkdir(parents=True)
                gw, made = GatewayProcess.start(
                    home,
                    mock_port,
                    ADMIN_KEY,
                    None,
                    extra_env={"SWITCHYARD_LEDGER": ledger},
                    policy_template=policy,
                    root=root,
                )
                gateways.append(gw)
                key = key or made  # one key, made on the first replica, used on every one
            urls = [g.url for g in gateways]
            asyncio.run(_load(urls, key, 1.0, concurrency, "warm"))  # connections, scripts, caches
            time.sleep(1.0)
            writes0, rows0 = pg_writes(schema)
            with RedisCommands(db) as redis_cmds:
                cpu0 = sum(cpu_seconds(g.proc.pid) or 0.0 for g in gateways)
                redis_cmds.start()
                load = _load(urls, key, seconds, concurrency, "run", temperature, conversations)
                reports = asyncio.run(load)
                ok = sum(r.ok for r in reports)
                cpu1 = sum(cpu_seconds(g.proc.pid) or 0.0 for g in gateways)
                time.sleep(1.0)  # the background settlements of the last requests
                redis_cmds.stop()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # every row shipped, the statistics flushed
                writes1, rows1 = pg_writes(schema)
                if rows1 - rows0 >= ok:
                    time.sleep(1.2)
                    writes1, rows1 = pg_writes(schema)
                    break
                time.sleep(0.3)
        finally:
            for g in gateways:
                g.stop()
            _forget(redis_url, prefix)
    duration = max(r.duration_s for r in reports)
    errors: dict[str, int] = {}
    for r in reports:
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
    per = max(ok, 1)
    return {
        "replicas": n,
        "ok": ok,
        "errors": errors,
        "rps": round(ok / duration, 1),
        "cpu_ms_per_request": round((cpu1 - cpu0) * 1000 / per, 3),
        "redis_commands_per_request": round(redis_cmds.count / per, 3),
        "redis_commands": dict(sorted(redis_cmds.by_name.items())),
        "pg_row_writes_per_request": round((writes1 - writes0) / per, 3),
        "ledger_rows_per_request": round((rows1 - rows0) / per, 3),
        "latency_ms_p50": _median([r.latency_ms["p50"] for r in reports]),
        "key_watch_pg_reads_per_s_per_replica": round(1 / INTERVAL_S, 1),
    }


def _median(values: list[float | None]) -> float | None:
    xs = sorted(v for v in values if v is not None)
    return round(xs[len(xs) // 2], 2) if xs else None


def _forget(redis_url: str, prefix: str) -> None:
    import redis

    with contextlib.suppress(redis.RedisError):
        client = redis.Redis.from_url(redis_url)
        for pattern in (prefix + "*", "switchyard:exact:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()


def projection(row: dict[str, Any], replicas: int = 50, rps: float = 20_000) -> dict[str, Any]:
    """What ``replicas`` replicas serving ``rps`` ask of Redis and PostgreSQL, from one run's
    per-request figures (they do not depend on the replica count: see the table)."""
    return {
        "replicas": replicas,
        "requests_per_s": rps,
        "redis_commands_per_s": round(rps * row["redis_commands_per_request"]),
        "pg_row_writes_per_s": round(rps * row["pg_row_writes_per_request"]),
        "ledger_rows_per_s": round(rps * row["ledger_rows_per_request"]),
        "pg_key_watch_reads_per_s": round(replicas * row["key_watch_pg_reads_per_s_per_replica"]),
        "gateway_cpu_cores": round(rps * row["cpu_ms_per_request"] / 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", default="1,2,3", help="replica counts to run, in order")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per count (max 60)")
    parser.add_argument(
        "--concurrency", type=int, default=24, help="clients in all, spread over the replicas"
    )
    parser.add_argument(
        "--temperature", type=float, default=None, help="0: every request an exact-cache lookup (all misses)"
    )
    parser.add_argument(
        "--conversations",
        action="store_true",
        help="every request a conversation turn (a system prompt; a new conversation every 5th)",
    )
    parser.add_argument(
        "--gateway-root", type=Path, default=None, help="run the gateway code of this tree (a git worktree)"
    )
    parser.add_argument("--redis-db", type=int, default=9, help="a Redis database the bench counts alone")
    parser.add_argument("--out", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",")]
    if not all(1 <= c <= 8 for c in counts) or not 0 < args.seconds <= 60 or not 1 <= args.concurrency <= 256:
        parser.error("replicas 1-8 each, --seconds in (0, 60], --concurrency 1-256")
    mock = MockProcess.start(None)
    rows = []
    try:
        with TemporaryDirectory(prefix="sy-replicas-") as tmp:
            for n in counts:
                work = Path(tmp)
                rows.append(
                    run_one(
                        n,
                        mock.port,
                        args.seconds,
                        args.concurrency,
                        args.redis_db,
                        work,
                        args.temperature,
                        args.conversations,
                        args.gateway_root,
                    )
                )
                print(rows[-1], flush=True)
    finally:
        mock.stop()
    proj = projection(rows[-1])
    payload = {"machine": machine_info(), "seconds": args.seconds, "concurrency": args.concurrency}
    payload |= {"temperature": args.temperature, "conversations": args.conversations}
    payload |= {"rows": rows, "projection_50x20k": proj}
    lines = [
        f"# Replicas sharing PostgreSQL and Redis ({args.seconds:g} s per count, {args.concurrency} clients, "
        f"temperature {args.temperature}{', conversation turns' if args.conversations else ''})",
        "",
        "| replicas | req/s | errors | CPU ms/req | Redis cmds/req | PG row writes/req | ledger rows/req "
        "| p50 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['replicas']} | {r['rps']} | {sum(r['errors'].values())} | {r['cpu_ms_per_request']} | "
            f"{r['redis_commands_per_request']} | {r['pg_row_writes_per_request']} | "
            f"{r['ledger_rows_per_request']} | {r['latency_ms_p50']} |"
        )
    lines += [
        "",
        f"Redis commands by name (last run): {rows[-1]['redis_commands']}",
        "",
        "## 50 replicas at 20,000 req/s, from the per-request figures",
        "",
        f"- Redis: {proj['redis_commands_per_s']:,} commands/s",
        f"- PostgreSQL: {proj['pg_row_writes_per_s']:,} row writes/s "
        f"({proj['ledger_rows_per_s']:,} ledger rows/s), "
        f"plus {proj['pg_key_watch_reads_per_s']:,} one-row key-watch reads/s",
        f"- gateway CPU: {proj['gateway_cpu_cores']} cores",
    ]
    save_report(args.out, "replicas", payload, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
