"""Fast seeding of a large ledger (10M rows) into SQLite and PostgreSQL, for the report
benchmark in ``ledger_bench``.

The rows are generated inside each database by one ``INSERT ... SELECT`` over a counter (no
Python per row: 10M rows in a minute or two, not half an hour), into a schema at v3 (before
the rollups). The rollups then come from the real v4 migration's back-fill, timed (v5 then
builds its index). Secondary indexes are dropped for the load; the migration builds v5's
covering ``ts`` index (the reports' edge rows, the raw baseline, the top conversations) and the
``(conversation, ts)`` index is rebuilt (``all_indexes=True``: every one; on a shared 2-core machine
eight index builds over 10M rows take longer than the rest of the benchmark).

Both stores get the same rows: every value is a function of the row number (multiplicative
hashes), so a month looks like a gateway's: 20 tenants, 200 keys (each key belongs to one
tenant), 10 routes of 3 models each, 2 providers, 5% exact-cache hits (no served model, no
cost), 2% errors (half of them unpriced), cached input tokens, 100k conversations (80% of
the rows), money in exact 1e-10 USD units.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Final

from gateway.ledger.schema import (
    CONVERSATION_INDEX,
    DROPPED_V7,
    POSTGRES_MIGRATIONS,
    ROLLUP_DAY,
    ROLLUP_HOUR,
    SQLITE_MIGRATIONS,
    TABLE,
    apply_migrations,
)
from gateway.ledger.sqlite import migrate, money_e10

DAY: Final = 86_400.0
TENANTS: Final = [f"tenant-{i:02d}" for i in range(20)]
N_KEYS: Final = 200
N_ROUTES: Final = 10
CONVERSATIONS: Final = 100_000
CHUNK: Final = 500_000


def _h(k: int) -> str:
    """A pseudo-random non-negative integer of the row number ``i`` (the k-th hash)."""
    return f"((i + {k * 1_000_003}) * 2654435761 % 4294967291)"


def _select(dialect: str) -> tuple[str, str]:
    """(column list, SELECT over ``i`` (the row number) and :start/:step) for ``dialect``."""
    sqlite = dialect == "sqlite"

    def fmt(pattern: str, value: str, width: int, prefix: str) -> str:
        if sqlite:
            return f"printf('{prefix}%0{width}{pattern}', {value})"
        text = f"to_hex({value})" if pattern == "x" else f"CAST({value} AS TEXT)"
        return f"'{prefix}' || lpad({text}, {width}, '0')"

    key = f"({_h(1)} % {N_KEYS})"
    route = f"({_h(2)} % {N_ROUTES})"
    model = f"(3 * {route} + {_h(3)} % 3)"
    hit = f"({_h(4)} % 20 = 0)"
    error = f"({_h(5)} % 50 = 0)"
    unpriced = f"({error} AND {_h(6)} % 2 = 0)"
    cost = f"(CASE WHEN {hit} THEN 0 ELSE {_h(7)} % 50000000 END)"
    base = f"(CASE WHEN {hit} THEN {_h(8)} % 50000000 ELSE 2 * {cost} END)"
    inp = f"(20 + {_h(9)} % 3981)"
    money = "CAST({e} AS NUMERIC) / 10000000000"
    if sqlite:  # exact decimal strings, as the writer stores them
        money = "printf('%d.%010d', {e} / 10000000000, {e} % 10000000000)"
    cause = f"(CASE WHEN {hit} THEN 'exact_cache' ELSE (CASE {_h(10)} % 6 WHEN 0 THEN 'routing' WHEN 1 THEN 'routing' WHEN 2 THEN 'self_hosted' WHEN 3 THEN 'semantic_cache' ELSE 'none' END) END)"  # noqa: E501
    cols = {
        "request_id": fmt("d", "i", 10, "bench-"),
        "ts": f"(? + (i + ({_h(11)} % 1000) / 1000.0) * ?)",
        "tenant": fmt("d", f"{key} % 20", 2, "tenant-"),
        "key_id": fmt("d", key, 9, "key"),
        "route": ("'route-' || " + (f"CAST({route} AS TEXT)" if not sqlite else f"{route}")),
        "requested_model": "'auto'",
        "served_model": f"CASE WHEN {hit} THEN NULL ELSE {fmt('d', model, 2, 'model-')} END",
        "provider": f"CASE WHEN {hit} THEN NULL WHEN {model} % 2 = 1 THEN 'openai' ELSE 'anthropic' END",
        "endpoint": "'chat'",
        "stream": "i % 2",
        "cache_status": f"CASE WHEN {hit} THEN 'hit' ELSE 'miss' END",
        "input_tokens": inp,
        "cached_tokens": f"CASE WHEN {_h(12)} % 2 = 0 THEN {_h(13)} % {inp} ELSE 0 END",
        "output_tokens": f"(1 + {_h(14)} % 1000)",
        "usage_estimated": "0",
        "cost_usd": f"CASE WHEN {unpriced} THEN NULL ELSE {money.format(e=cost)} END",
        "baseline_cost_usd": f"CASE WHEN {unpriced} THEN NULL ELSE {money.format(e=base)} END",
        "latency_ms": f"({_h(15)} % 2000000) / 1000.0",
        "status": f"CASE WHEN {error} THEN 'error' ELSE 'ok' END",
        "http_status": f"CASE WHEN {error} THEN 502 ELSE 200 END",
        "error_code": f"CASE WHEN {error} THEN 'upstream' END",
        "attempts": "1",
        "savings_cause": cause,
        "conversation": f"CASE WHEN {_h(16)} % 5 = 0 THEN NULL ELSE {fmt('x', f'{_h(17)} % {CONVERSATIONS}', 16, '')} END",  # noqa: E501
    }
    if sqlite:
        cols["cost_e10"] = f"CASE WHEN {unpriced} THEN NULL ELSE {cost} END"
        cols["baseline_e10"] = f"CASE WHEN {unpriced} THEN NULL ELSE {base} END"
    return ", ".join(cols), ", ".join(cols.values())


def _sqlite_e10(value: str | None) -> int | None:
    from decimal import Decimal

    return None if value is None else money_e10(Decimal(value))


def _rebuilt(indexes: list[Any], all_indexes: bool) -> list[Any]:
    """The indexes to build after the load: the (conversation, ts, cost) index the top-N
    conversation report sums its picks with (``all_indexes``: every one). The plain ts index
    is not rebuilt: v5 replaced it by the covering one, which the migration builds."""
    kept = [ix for ix in indexes if ix[0] != f"ix_{TABLE}_ts" and ix[0] not in DROPPED_V7]
    return [ix for ix in kept if all_indexes or ix[0] == CONVERSATION_INDEX]


def seed_sqlite(path: Path, n: int, end: float, *, all_indexes: bool = False) -> dict[str, Any]:
    """A new SQLite ledger at ``path`` with ``n`` rows over the 30 days before ``end``,
    migrated to the current schema (the v4 back-fill builds the rollups)."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.create_function("sy_e10", 1, _sqlite_e10, deterministic=True)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -1000000")
    conn.execute("BEGIN")
    apply_migrations(conn.execute, {v: SQLITE_MIGRATIONS[v] for v in (1, 2, 3)}, "?")
    conn.execute("COMMIT")
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name LIKE 'ix_%'",
        (TABLE,),
    ).fetchall()
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    cols, select = _select("sqlite")
    start, step = end - 30 * DAY, 30 * DAY / n
    t0 = time.perf_counter()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        conn.execute("BEGIN")
        conn.execute(
            f"WITH RECURSIVE g(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM g WHERE i + 1 < ?) "
            f"INSERT INTO {TABLE} ({cols}) SELECT {select} FROM g",
            (lo, hi, start, step),
        )
        conn.execute("COMMIT")
    t1 = time.perf_counter()
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn)  # v4: the rollups, back-filled from the rows
    t2 = time.perf_counter()
    for _, sql in _rebuilt(indexes, all_indexes):
        conn.execute(sql)
    conn.execute("ANALYZE")
    t3 = time.perf_counter()
    rollups = {
        t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t in ("ledger_rollup_hour", "ledger_rollup_day")
    }
    conn.close()
    return {
        "insert_s": round(t1 - t0, 1),
        "v4_backfill_s": round(t2 - t1, 1),
        "indexes_s": round(t3 - t2, 1),
        "indexes_rebuilt": [ix[0] for ix in _rebuilt(indexes, all_indexes)],
        "rollup_rows": rollups,
    }


def seed_postgres(conn: Any, n: int, end: float, *, all_indexes: bool = False) -> dict[str, Any]:
    """The same ``n`` rows into an empty PostgreSQL schema (``conn``'s search_path), then the
    v4 migration (its back-fill builds the rollups)."""
    from gateway.ledger.postgres import pg_migrate

    with conn.transaction(), conn.cursor() as cur:
        apply_migrations(cur.execute, {v: POSTGRES_MIGRATIONS[v] for v in (1, 2, 3)}, "%s")
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname LIKE 'ix_%%'"
        " AND schemaname = current_schema()",
        (TABLE,),
    ).fetchall()
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    conn.commit()
    cols, select = _select("postgres")
    start, step = end - 30 * DAY, 30 * DAY / n
    t0 = time.perf_counter()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        conn.execute(
            f"INSERT INTO {TABLE} ({cols}) SELECT {select.replace('%', '%%').replace('?', '%s')} "
            "FROM generate_series(%s::bigint, %s::bigint) AS i",
            (start, step, lo, hi - 1),
        )
        conn.commit()
    t1 = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute("SET work_mem = '256MB'")
    conn.commit()
    pg_migrate(conn)
    t2 = time.perf_counter()
    for _, sql in _rebuilt(indexes, all_indexes):
        conn.execute(sql)
    conn.commit()
    conn.autocommit = True
    for table in (TABLE, ROLLUP_HOUR, ROLLUP_DAY):
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.autocommit = False
    t3 = time.perf_counter()
    rollups = {
        t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t in ("ledger_rollup_hour", "ledger_rollup_day")
    }
    conn.commit()
    return {
        "insert_s": round(t1 - t0, 1),
        "v4_backfill_s": round(t2 - t1, 1),
        "indexes_and_analyze_s": round(t3 - t2, 1),
        "indexes_rebuilt": [ix[0] for ix in _rebuilt(indexes, all_indexes)],
        "rollup_rows": rollups,
    }
