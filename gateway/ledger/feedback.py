"""Feedback on served requests, kept with the ledger (``ledger_feedback``, schema v11), and the
quality reports and learned-route evidence read from it joined to the ledger rows.

One connection to the ledger database (SQLite file or PostgreSQL) used by one worker thread:
``submit`` hands the write to it and awaits the answer, so the event loop does no database
work. A score is accepted only for a request id whose ledger row belongs to the caller's
tenant; a later score for the same request replaces the earlier one.

On PostgreSQL a request's row may still sit in the replica's local outbox for a moment after
the answer; feedback sent in that moment is refused as unknown (404) and may be sent again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, TypeVar

from gateway.ledger.pg import pg_connect
from gateway.ledger.schema import FEEDBACK_TABLE, TABLE
from gateway.ledger.sqlite import connect, is_postgres_url, ledger_path, migrate

T = TypeVar("T")
_OWNER: Final = f"SELECT tenant, route, task, served_model, route_decision FROM {TABLE} WHERE request_id = ?"
_UPSERT: Final = (
    f"INSERT INTO {FEEDBACK_TABLE} (request_id, tenant, score, ts, source) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (request_id) DO UPDATE SET score = excluded.score, ts = excluded.ts, "
    "source = excluded.source"
)
# The learned routes' evidence: per tenant, task and served model of one route.
_OUTCOMES: Final = (
    f"SELECT l.tenant, l.task, l.served_model, COUNT(*), SUM(f.score) FROM {FEEDBACK_TABLE} f "
    f"JOIN {TABLE} l ON l.request_id = f.request_id WHERE l.route = ? AND l.task IS NOT NULL "
    "AND l.served_model IS NOT NULL GROUP BY l.tenant, l.task, l.served_model"
)


@dataclass(frozen=True, slots=True)
class Owner:
    """The ledger facts of a request that received feedback."""

    route: str | None
    task: str | None
    model: str | None
    decision: str | None  # the ledger's route_decision (a learned route: explore:/exploit:<task>)


@dataclass(frozen=True, slots=True)
class Outcome:
    tenant: str
    task: str
    model: str
    n: int
    total: float  # sum of scores


@dataclass(frozen=True, slots=True)
class QualityLine:
    group: tuple[str | None, ...]  # the grouping values, e.g. (route, task, model)
    requests: int
    cost_usd: Decimal
    rated: int  # requests with feedback
    quality: float | None  # mean score of the rated ones


class FeedbackStore:
    """``url``: the ledger URL (``sqlite:///...``, a path, or ``postgresql://...``)."""

    def __init__(self, url: str) -> None:
        self.url = url.strip()
        self.postgres = is_postgres_url(self.url)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-feedback")
        self._conn: Any = None
        self._lock = threading.Lock()

    # -- the connection (worker thread or a CLI) -------------------------------------------
    def _db(self) -> Any:
        if self._conn is None:
            if self.postgres:
                from gateway.ledger.postgres import pg_migrate

                pg = pg_connect(self.url)
                pg_migrate(pg)
                pg.autocommit = True
                self._conn = pg
            else:
                path: Path = ledger_path(self.url)
                path.parent.mkdir(parents=True, exist_ok=True)
                conn = connect(path, check_same_thread=False)
                migrate(conn)
                self._conn = conn
        return self._conn

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = self._db()
        if self.postgres:
            with conn.cursor() as cur:
                cur.execute(sql.replace("?", "%s"), params)
                return list(cur.fetchall()) if cur.description else []
        return list(conn.execute(sql, params).fetchall())

    # -- writes -------------------------------------------------------------------------
    def put(self, tenant: str | None, request_id: str, score: float, source: str) -> Owner | None:
        """Store one score (blocking). ``tenant`` None: whoever owns the request (imports).
        None when no ledger row has that id (for that tenant)."""
        with self._lock:
            found = self._rows(_OWNER, (request_id,))
            if not found or (tenant is not None and found[0][0] != tenant):
                return None
            self._rows(_UPSERT, (request_id, found[0][0], float(score), time.time(), source))
            _, route, task, model, decision = found[0]
            return Owner(route, task, model, decision)

    async def submit(self, tenant: str, request_id: str, score: float, source: str = "api") -> Owner | None:
        """``put`` on the worker thread; the loop only hands it over and awaits."""
        return await self.call(lambda: self.put(tenant, request_id, score, source))

    def call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run blocking ``fn`` on the store's worker thread (from the event loop)."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def import_scores(self, rows: Iterable[tuple[str, float]]) -> tuple[int, list[str]]:
        """Store offline labels (request id, score): (stored, the unknown ids)."""
        stored, unknown = 0, []
        for request_id, score in rows:
            if self.put(None, request_id, score, "import") is not None:
                stored += 1
            else:
                unknown.append(request_id)
        return stored, unknown

    # -- reads --------------------------------------------------------------------------
    def outcomes(self, route: str) -> list[Outcome]:
        """The evidence of one route, for its learners (blocking)."""
        with self._lock:
            rows = self._rows(_OUTCOMES, (route,))
        return [Outcome(str(t), str(k), str(m), int(n), float(s or 0.0)) for t, k, m, n, s in rows]

    def requests_per_task(self, route: str) -> dict[tuple[str, str], int]:
        """Requests served per (tenant, task) of a route (the traffic weights)."""
        sql = (
            f"SELECT tenant, task, COUNT(*) FROM {TABLE} WHERE route = ? AND task IS NOT NULL "
            "AND served_model IS NOT NULL GROUP BY tenant, task"
        )
        with self._lock:
            rows = self._rows(sql, (route,))
        return {(str(t), str(k)): int(n) for t, k, n in rows}

    def explored_per_task(self, route: str) -> dict[tuple[str, str], int]:
        """Requests per (tenant, task) of a route that explored (``route_decision`` explore:...):
        every replica's and every earlier process's, so the exploration allowance is the
        route's, not each process's (blocking)."""
        sql = (
            f"SELECT tenant, task, COUNT(*) FROM {TABLE} WHERE route = ? AND task IS NOT NULL "
            "AND served_model IS NOT NULL AND route_decision LIKE ? GROUP BY tenant, task"
        )
        with self._lock:
            rows = self._rows(sql, (route, "explore:%"))
        return {(str(t), str(k)): int(n) for t, k, n in rows}

    def quality(
        self, by: tuple[str, ...], tenant: str | None = None, since: float | None = None
    ) -> list[QualityLine]:
        """Requests, spend and feedback quality grouped by ledger columns ``by`` (of
        ``QUALITY_GROUPS``), over the served requests (blocking)."""
        bad = [b for b in by if b not in QUALITY_GROUPS]
        if bad:
            raise ValueError(f"cannot group quality by {', '.join(bad)}; use {', '.join(QUALITY_GROUPS)}")
        cols = ", ".join(f"l.{QUALITY_GROUPS[b]}" for b in by)
        cost = "l.cost_usd" if self.postgres else "l.cost_e10"
        where: list[str] = ["l.served_model IS NOT NULL"]
        params: list[Any] = []
        if tenant is not None:
            where.append("l.tenant = ?")
            params.append(tenant)
        if since is not None:
            where.append("l.ts >= ?")
            params.append(since)
        sql = (
            f"SELECT {cols}, COUNT(*), SUM({cost}), COUNT(f.score), AVG(f.score) FROM {TABLE} l "
            f"LEFT JOIN {FEEDBACK_TABLE} f ON f.request_id = l.request_id WHERE {' AND '.join(where)} "
            f"GROUP BY {cols} ORDER BY {cols}"
        )
        with self._lock:
            rows = self._rows(sql, tuple(params))
        out = []
        k = len(by)
        for r in rows:
            money = r[k + 1]
            if money is None:
                usd = Decimal(0)
            elif self.postgres:
                usd = Decimal(money)
            else:
                usd = Decimal(int(money)).scaleb(-10)
            avg = r[k + 3]
            mean = None if avg is None else float(avg)
            out.append(QualityLine(tuple(r[:k]), int(r[k]), usd, int(r[k + 2]), mean))
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


QUALITY_GROUPS: Final = {
    "route": "route",
    "task": "task",
    "model": "served_model",
    "tenant": "tenant",
    "decision": "route_decision",
}
