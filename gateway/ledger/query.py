"""Read-only access to either ledger store for reports: one connection, one SQL dialect.

SQL is written once with ``?`` placeholders and the dialect's expressions for money sums and
time buckets; ``LedgerDb`` runs it on SQLite (exact INTEGER sums of 1e-10 USD units) or on
PostgreSQL (exact NUMERIC sums). Money leaves as ``Decimal`` quantized to 1e-10 USD.

``grouped`` answers every report: the hours and days lying wholly inside the window come from
the rollups (schema v4: ``ledger_rollup_day`` for whole days, ``ledger_rollup_hour`` for the
whole hours around them), the partial hours at the window's edges from the raw rows. A bucket
is "whole" by the same hour function the writers file rows under (``trunc(ts / 3600)``), so
every row is counted once, by exactly one of the parts, and the sums are exact. On SQLite the
writer rolls rows up a little after committing them (schema v6): the rows after the rollup mark
are read raw for the whole buckets too, in the same read transaction as the rollups and the
mark (a report is one snapshot), so they are counted once as well. Groups the
rollups do not keep (``conversation``: too many) are read from the raw rows: the top N
conversations are picked from the covering ts index alone (schema v5), then only their rows
are summed. ``spent_by`` (one key, tenant or route) takes the same plan as every report.
PostgreSQL report connections are reused (``pg.ReportConnections``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from gateway.core.errors import ServiceUnavailableError
from gateway.ledger import spans
from gateway.ledger.pg import REPORT_CONNECTIONS
from gateway.ledger.pricing import quantize_usd
from gateway.ledger.rollup import decode, encode, hour_of, mark
from gateway.ledger.schema import (
    DIM_SQL,
    POSTGRES_HOUR_SQL,
    ROLLUP_DAY,
    ROLLUP_DIMS,
    ROLLUP_HOUR,
    ROLLUP_MARK,
    ROLLUP_MEASURES,
    SCHEMA_VERSION,
    SQLITE_HOUR_SQL,
    TABLE,
)
from gateway.ledger.sqlite import BUSY_TIMEOUT_MS, is_postgres_url, ledger_path, migrate

Dialect = Literal["sqlite", "postgres"]
Scope = Literal["key", "tenant", "route"]
ZERO: Final = Decimal("0E-10")
GROUP_SQL: Final[dict[str, str]] = {**DIM_SQL, "conversation": "conversation", "none": "'all'"}
ROLLUP_ROWS_VERSION: Final = 4  # the schema version that brought the rollups
SPANS_VERSION: Final = 8  # ... and the conversation spans
Sums = list[Any]  # ROLLUP_MEASURES as read: counts, token sums, money sums (None: no value)
Grouped = dict[tuple[Any, str | None], Sums]  # (bucket value, group key) -> sums
SCOPE_COLUMN: Final[dict[str, str]] = {"key": "key_id", "tenant": "tenant", "route": "route"}
_BUCKET_SECONDS: Final = {"hour": 3600, "day": 86400}
_BUCKET_FORMAT: Final = {"hour": "%Y-%m-%dT%H:00:00Z", "day": "%Y-%m-%d"}


class LedgerUnavailable(ServiceUnavailableError):
    """The ledger database could not be reached (PostgreSQL down, bad URL, no psycopg)."""

    code = "ledger_unavailable"


@dataclass(frozen=True, slots=True)
class Window:
    """Rows with ``since <= ts < until`` (unix seconds; None: unbounded), of one tenant."""

    since: float | None = None
    until: float | None = None
    tenant: str | None = None

    def where(self) -> tuple[str, tuple[Any, ...]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.since is not None:
            clauses.append("ts >= ?")
            params.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            params.append(self.until)
        if self.tenant is not None:
            clauses.append("tenant = ?")
            params.append(self.tenant)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params)


class LedgerDb:
    """One open ledger connection (see ``open_db``)."""

    def __init__(
        self,
        dialect: Dialect,
        conn: Any,
        *,
        rollups: bool = False,
        rolled_through: int | None = None,
        spans: bool = False,
    ) -> None:
        self.dialect = dialect
        self.conn = conn
        self.rollups = rollups  # the rollup tables exist and are kept (schema v4)
        self.rolled_through = rolled_through  # SQLite v6: rows after this id are not rolled up yet
        self.spans = spans  # v8: the conversation spans are complete and kept (``spans.top``)

    # -- dialect pieces --------------------------------------------------------------------
    def group_sql(self, group: str) -> str:
        """The grouping expression. On SQLite a plain column gets a unary ``+``: without it the
        planner walks a whole (column, ts) index to skip the GROUP BY sort, reading every row
        ever written where the ts index finds one day's rows directly."""
        sql = GROUP_SQL[group]
        if self.dialect == "sqlite" and sql.isidentifier():
            return "+" + sql
        return sql

    @property
    def cost(self) -> str:
        return "cost_e10" if self.dialect == "sqlite" else "cost_usd"

    @property
    def baseline(self) -> str:
        return "baseline_e10" if self.dialect == "sqlite" else "baseline_cost_usd"

    def bucket_sql(self, bucket: str, ts: str = "ts") -> str:
        if bucket == "none":
            return "'all'"
        if bucket == "month":
            if self.dialect == "sqlite":
                return f"strftime('%Y-%m', {ts}, 'unixepoch')"
            return f"to_char(to_timestamp({ts}) AT TIME ZONE 'UTC', 'YYYY-MM')"
        seconds = _BUCKET_SECONDS[bucket]
        if self.dialect == "sqlite":
            return f"CAST({ts} / {seconds} AS INTEGER)"
        return f"CAST(floor({ts} / {seconds}) AS BIGINT)"

    @property
    def hour_sql(self) -> str:
        """The hour bucket of a raw row, as the writers file it (``rollup.hour_of``)."""
        return SQLITE_HOUR_SQL if self.dialect == "sqlite" else POSTGRES_HOUR_SQL

    def aggregates(self) -> str:
        """The raw rows' sums, in ``ROLLUP_MEASURES`` order."""
        cost, base = self.cost, self.baseline
        return (
            "COUNT(*), SUM(CASE WHEN status = 'ok' THEN 0 ELSE 1 END), "
            f"SUM(CASE WHEN {cost} IS NULL THEN 1 ELSE 0 END), "
            "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(cached_tokens), 0), "
            f"COALESCE(SUM(output_tokens), 0), SUM({cost}), SUM({base}), SUM({base} - {cost})"
        )

    @staticmethod
    def bucket_label(bucket: str, value: Any) -> str:
        if bucket in _BUCKET_SECONDS:
            ts = int(value) * _BUCKET_SECONDS[bucket]
            return datetime.fromtimestamp(ts, UTC).strftime(_BUCKET_FORMAT[bucket])
        return str(value)

    def money(self, value: Any) -> Decimal:
        """A SUM of money as Decimal USD (None: 0)."""
        if value is None:
            return ZERO
        if self.dialect == "sqlite":
            return quantize_usd(Decimal(int(value)).scaleb(-10))
        return quantize_usd(Decimal(value))

    # -- running ---------------------------------------------------------------------------
    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.dialect == "postgres":
            with self.conn.cursor() as cur:
                cur.execute(sql.replace("?", "%s"), tuple(params))
                return list(cur.fetchall())
        return list(self.conn.execute(sql, tuple(params)).fetchall())


def _sqlite_ready(conn: sqlite3.Connection) -> bool:
    """The ledger table exists (migrated to the current version, if it was older)."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if not found:
        return False
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    if row is None or row[0] is None or int(row[0]) < SCHEMA_VERSION:
        conn.isolation_level = None
        migrate(conn)
    return True


def _pg_probe(pg: Any) -> tuple[bool, bool, bool]:
    """(the ledger table exists, it has the rollups, the conversation spans are kept) on a
    PostgreSQL connection."""
    kept = False
    with pg.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (TABLE,))
        found = cur.fetchone()
        version = 0
        if found and found[0] is not None:
            cur.execute("SELECT MAX(version) FROM schema_migrations")
            got = cur.fetchone()
            version = int(got[0]) if got and got[0] is not None else 0
        if version >= SPANS_VERSION:
            cur.execute(f"SELECT spans FROM {ROLLUP_MARK}")
            got = cur.fetchone()
            kept = bool(got and got[0])
    ready = found is not None and found[0] is not None
    return ready, version >= ROLLUP_ROWS_VERSION, kept


@contextmanager
def _open_pg(url: str) -> Iterator[LedgerDb | None]:
    """A report connection from ``REPORT_CONNECTIONS``: an idle one that turns out dead (the
    server restarted, the backend was terminated) is replaced by a new one, once."""
    try:
        pg, reused = REPORT_CONNECTIONS.take(url)
        try:
            probed = _pg_probe(pg)
        except Exception:
            if not reused:
                pg.close()
                raise
            pg.close()
            pg = REPORT_CONNECTIONS.connect(url)
            probed = _pg_probe(pg)
    except LedgerUnavailable:
        raise
    except Exception as exc:  # psycopg.Error, or psycopg missing
        raise LedgerUnavailable(f"cannot connect to the PostgreSQL ledger: {exc}") from None
    try:
        ready, rollups, kept = probed
        yield LedgerDb("postgres", pg, rollups=rollups, spans=kept) if ready else None
    finally:
        REPORT_CONNECTIONS.give(url, pg)


@contextmanager
def open_db(url: str | Path) -> Iterator[LedgerDb | None]:
    """A ``LedgerDb`` for ``url`` (SQLite path/URL or postgresql://), or None when the ledger
    does not exist yet (a report never creates one). PostgreSQL connections are reused across
    reports (``pg.ReportConnections``)."""
    if is_postgres_url(url):
        with _open_pg(str(url).strip()) as db:
            yield db
        return
    path = ledger_path(url)
    if not path.is_file():
        yield None
        return
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not _sqlite_ready(conn):
            yield None
            return
        conn.execute("BEGIN")  # one snapshot (WAL) for the mark, the rollups and the raw rows
        (kept,) = conn.execute(f"SELECT spans FROM {ROLLUP_MARK}").fetchone()
        yield LedgerDb("sqlite", conn, rollups=True, rolled_through=mark(conn), spans=bool(kept))
    finally:
        conn.close()


def _check_scope(scope: str) -> str:
    if scope not in SCOPE_COLUMN:
        raise ValueError(f"bad scope {scope!r}: expected one of {', '.join(SCOPE_COLUMN)}")
    return SCOPE_COLUMN[scope]


def spent_since(url: str | Path, scope: str, since_ts: float, *, rollups: bool = True) -> dict[str, Decimal]:
    """USD spent per key/tenant/route name since ``since_ts`` (seeds the budgets).
    ``rollups=False``: from the raw rows only (the PostgreSQL outbox, which keeps none)."""
    _check_scope(scope)
    with open_db(url) as db:
        if db is None:
            return {}
        db.rollups = db.rollups and rollups
        sums = grouped(db, scope, "none", Window(since_ts))
        return {str(key): db.money(s[6]) for (_, key), s in sums.items() if key is not None}


def spent_by(url: str | Path, scope: Scope, name: str, since_ts: float) -> Decimal:
    """USD spent by one key/tenant/route since ``since_ts``."""
    _check_scope(scope)
    with open_db(url) as db:
        if db is None:
            return ZERO
        sums = grouped(db, scope, "none", Window(since_ts), only=name)
        return sum((db.money(s[6]) for s in sums.values()), ZERO)


# -- one report, from the rollups and the edge rows ---------------------------------------------
Part = tuple[str, Any, Any]  # ("raw", Window, (extra SQL, params)) or (rollup table, first, end bucket)


def plan(since: float | None, until: float | None, *, hourly: bool = False) -> list[Part]:
    """Split the window ``since <= ts < until`` into raw edge rows and whole rollup buckets.
    An hour bucket is whole when every row filed under it lies in the window: the buckets after
    the one holding ``since`` and before the one holding ``until`` (``hour_of`` is monotonic,
    so a row filed later than ``since``'s hour has ``ts > since``). A day is whole when its 24
    hours are. ``hourly``: no day buckets (hour series). A raw part's window is narrowed to its
    edge (a second of slack either side: the hour test decides), so an index finds it."""
    lo = None if since is None else hour_of(since) + 1  # first whole hour
    hi = None if until is None else hour_of(until)  # end (exclusive) of the whole hours
    if lo is not None and hi is not None and lo >= hi:
        return [("raw", Window(since, until), ("", ()))]
    parts: list[Part] = []
    if lo is not None:  # the rows of since's hour
        edge = lo * 3600 + 1
        parts.append(
            ("raw", Window(since, edge if until is None else min(until, edge)), (" AND {hour} < ?", (lo,)))
        )
    if hi is not None:  # the rows of until's hour
        edge = hi * 3600 - 1
        parts.append(
            ("raw", Window(edge if since is None else max(since, edge), until), (" AND {hour} >= ?", (hi,)))
        )
    first_day = None if lo is None else -(-lo // 24)
    end_day = None if hi is None else hi // 24
    if hourly or (first_day is not None and end_day is not None and first_day >= end_day):
        parts.append((ROLLUP_HOUR, lo, hi))
        return parts
    if lo is not None and first_day is not None and lo < first_day * 24:
        parts.append((ROLLUP_HOUR, lo, first_day * 24))
    parts.append((ROLLUP_DAY, first_day, end_day))
    if hi is not None and end_day is not None and end_day * 24 < hi:
        parts.append((ROLLUP_HOUR, end_day * 24, hi))
    return parts


def grouped(
    db: LedgerDb,
    group: str,
    bucket: str,
    window: Window,
    *,
    top: int | None = None,
    only: str | None = None,
) -> Grouped:
    """Sums per (bucket, group) over ``window``: ``group`` one of ``GROUP_SQL``, ``bucket``
    hour|day|month|none. ``top``: only the ``top`` conversations by cost (``conversation``
    groups only; rows without a conversation are left out). ``only``: the one group whose
    value is ``only`` (a rollup dimension)."""
    out: Grouped = {}
    if group == "conversation" or not db.rollups:
        extra, params = _only(db, group, only)
        _add(out, _raw(db, group, bucket, window, extra, params, top), decoded=False)
        return out
    parts = plan(window.since, window.until, hourly=bucket == "hour")
    if db.rolled_through is not None and any(source != "raw" for source, _, _ in parts):
        lo = None if window.since is None else hour_of(window.since) + 1
        hi = None if window.until is None else hour_of(window.until)
        _add(out, _unrolled(db, group, bucket, window.tenant, lo, hi, only), decoded=False)
    for source, a, b in parts:
        if source == "raw":
            edge = Window(a.since, a.until, window.tenant)
            extra, params = _only(db, group, only)
            extra, params = b[0].format(hour=db.hour_sql) + extra, (*b[1], *params)
            _add(out, _raw(db, group, bucket, edge, extra, params, None), decoded=False)
        else:
            found = _rolled(db, source, group, bucket, window.tenant, a, b, only)
            _add(out, found, decoded=group != "none")
    return out


def _only(db: LedgerDb, group: str, only: str | None) -> tuple[str, tuple[Any, ...]]:
    """The raw rows' condition for ``grouped``'s ``only``."""
    if only is None:
        return "", ()
    return f" AND {GROUP_SQL[group]} = ?", (only,)


def _add(out: Grouped, rows: list[tuple[Any, ...]], *, decoded: bool) -> None:
    for r in rows:
        key = (r[0], decode(r[1]) if decoded else r[1])
        have = out.get(key)
        if have is None:
            out[key] = list(r[2:])
            continue
        for i, v in enumerate(r[2:]):
            if v is not None:
                have[i] = v if have[i] is None else have[i] + v


def _raw(
    db: LedgerDb,
    group: str,
    bucket: str,
    window: Window,
    extra: str,
    params: tuple[Any, ...],
    top: int | None,
) -> list[tuple[Any, ...]]:
    where, wparams = window.where()
    where = (where or " WHERE 1 = 1") + extra
    all_params: tuple[Any, ...] = (*wparams, *params)
    if group == "conversation":
        where += " AND conversation IS NOT NULL"
        if top is not None:
            ids = None
            if window.tenant is None and not extra and db.rollups:
                ids = spans.top(db, window.since, window.until, top)
            if ids is None:
                ids = _top_conversations(db, where, all_params, top)
            if not ids:
                return []
            where += f" AND conversation IN ({', '.join('?' for _ in ids)})"
            all_params = (*all_params, *ids)
    sql = f"SELECT {db.bucket_sql(bucket)}, {db.group_sql(group)}, {db.aggregates()} FROM {TABLE}{where}"
    return db.rows(sql + " GROUP BY 1, 2", all_params)


def _unrolled(
    db: LedgerDb,
    group: str,
    bucket: str,
    tenant: str | None,
    first_hour: int | None,
    end_hour: int | None,
    only: str | None,
) -> list[tuple[Any, ...]]:
    """The rows after the rollup mark filed under the whole hours ``[first_hour, end_hour)``
    (the hours ``plan`` reads from the rollups): a rowid range, never an index walk (``+``)."""
    clauses: list[str] = ["id > ?"]
    params: list[Any] = [db.rolled_through]
    for sql, v in (
        ("+tenant = ?", tenant),
        (f"{db.hour_sql} >= ?", first_hour),
        (f"{db.hour_sql} < ?", end_hour),
        (f"{db.group_sql(group)} = ?", only),
    ):
        if v is not None:
            clauses.append(sql)
            params.append(v)
    sql = (
        f"SELECT {db.bucket_sql(bucket)}, {db.group_sql(group)}, {db.aggregates()} FROM {TABLE} "
        f"WHERE {' AND '.join(clauses)} GROUP BY 1, 2"
    )
    return db.rows(sql, params)


def _top_conversations(db: LedgerDb, where: str, params: tuple[Any, ...], top: int) -> list[str]:
    """The ``top`` conversations by cost over the rows ``where`` picks (ties: by id). Over a
    window of time alone it reads the covering ts index only (schema v5: ts, conversation,
    cost), not the rows; ``_raw`` then sums just those conversations' rows, exactly."""
    sql = (
        f"SELECT {db.group_sql('conversation')} FROM {TABLE}{where} GROUP BY 1 "
        f"ORDER BY SUM({db.cost}) DESC NULLS LAST, 1 LIMIT ?"
    )
    return [r[0] for r in db.rows(sql, (*params, top))]


def _rolled(
    db: LedgerDb,
    table: str,
    group: str,
    bucket: str,
    tenant: str | None,
    first: Any,
    end: Any,
    only: str | None = None,
) -> list[tuple[Any, ...]]:
    seconds = 3600 if table == ROLLUP_HOUR else 86_400
    if bucket == "day" and table == ROLLUP_HOUR:
        when = "bucket / 24"
    elif bucket in ("hour", "day"):
        when = "bucket"
    else:
        when = db.bucket_sql(bucket, f"bucket * {seconds}")
    dim = "tenant" if group == "none" else group
    if dim not in ROLLUP_DIMS:
        raise ValueError(f"no rollup of {group!r}")
    value = "'all'" if group == "none" else "value"
    clauses, params = ["dim = ?"], [dim]
    value_is = None if only is None else encode(only)
    for sql, v in (
        ("bucket >= ?", first),
        ("bucket < ?", end),
        ("tenant = ?", tenant),
        ("value = ?", value_is),
    ):
        if v is not None:
            clauses.append(sql)
            params.append(v)
    sums = ", ".join(f"SUM({m})" for m in ROLLUP_MEASURES)
    sql = f"SELECT {when}, {value}, {sums} FROM {table} WHERE {' AND '.join(clauses)} GROUP BY 1, 2"
    return db.rows(sql, params)
