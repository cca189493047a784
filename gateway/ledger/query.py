"""Every spend report's sums, on either store (``db.LedgerDb``), exact to 1e-10 USD.

``grouped`` answers every report: the hours and days lying wholly inside the window come from
the rollups (schema v4: ``ledger_rollup_day`` for whole days, ``ledger_rollup_hour`` for the
whole hours around them), the partial hours at the window's edges from the raw rows. A bucket
is "whole" by the same hour function the writers file rows under (``trunc(ts / 3600)``), so
every row is counted once, by exactly one of the parts, and the sums are exact. On SQLite the
writer rolls rows up a little after committing them (schema v6): the rows after the rollup mark
are read raw for the whole buckets too, in the same read transaction as the rollups and the
mark (a report is one snapshot), so they are counted once as well. Groups the
rollups do not keep (``conversation``: too many) are read from the raw rows: the top N
conversations are picked by ``conversations.top``, then only their rows are summed. ``spent_by``
(one key, tenant or route) takes the same plan as every report.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from gateway.ledger import conversations
from gateway.ledger.db import GROUP_SQL, RAW_GROUPS, ZERO, LedgerDb, Window, open_db
from gateway.ledger.rollup import decode, encode, hour_of
from gateway.ledger.schema import ROLLUP_DAY, ROLLUP_DIMS, ROLLUP_HOUR, ROLLUP_MEASURES, TABLE

Scope = Literal["key", "tenant", "route"]
Sums = list[Any]  # ROLLUP_MEASURES as read: counts, token sums, money sums (None: no value)
Grouped = dict[tuple[Any, str | None], Sums]  # (bucket value, group key) -> sums
SCOPE_COLUMN: Final[dict[str, str]] = {"key": "key_id", "tenant": "tenant", "route": "route"}


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
    if group in RAW_GROUPS or not db.rollups:
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
            ids = conversations.top(db, window, where, all_params, top, spans=not extra)
            if not ids:
                return []
            extra_ids, ids_params = conversations.among(ids)
            where, all_params = where + extra_ids, (*all_params, *ids_params)
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
