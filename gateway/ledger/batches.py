"""The Batch API's state in the ledger's database (core.ports_batch.BatchStore; tables of schema
v12): ``batches`` and ``batch_items``, SQLite or PostgreSQL, beside the ledger's rows.

An item moves pending -> running (claimed, with a lease) -> a final status. The result and the
item's ledger row are written in ONE transaction (``complete``), so a crash either keeps both
or neither; the row is then handed to the ledger and the item marked ``billed``. After a crash
``unbilled`` gives back the rows still to hand over (the ledger skips a request id it already
has), and an item whose lease ran out (its worker died mid-run) is claimed again: no item is
lost, and none has two results or two ledger rows.

Before a run's first upstream call the item's send is recorded (``mark_sent``: while an item
runs, its ``result`` column holds ``{"sent": attempt}``; a final result replaces it). A claim
that finds such a note took over an item whose call began and never completed (a crash, a
shutdown mid-call): ``Claimed.interrupted``, so the runner resends it under the same
idempotency key, or fails it, by the route's ``batch.on_interrupted``.

One connection behind a lock; the async methods run the SQL off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from gateway.core.batch import Batch, Claimed, ItemResult, NewItem
from gateway.ledger.pg_conn import PgConn
from gateway.ledger.schema import BATCH_ITEMS, BATCHES
from gateway.ledger.sqlite import connect, immediate, is_postgres_url, ledger_path

_BATCH_COLS: Final = (
    "id",
    "tenant",
    "key_id",
    "api",
    "endpoint",
    "model",
    "input_file_id",
    "completion_window",
    "metadata",
    "status",
    "created_at",
    "expires_at",
    "times",
    "output_file_id",
    "error_file_id",
    "errors",
    "upstream",
)
_JSON_COLS: Final = frozenset({"metadata", "times", "errors", "upstream"})
_SELECT_BATCH: Final = f"SELECT {', '.join(_BATCH_COLS)} FROM {BATCHES}"
# Two seeks on the (status, batch_id, idx) index, not a walk over the batch's finished items
# (a claim grew with the items done: 1.3 ms at 5,000 done); the status is checked again on the
# row itself, so two claimers racing (PostgreSQL re-reads a row changed meanwhile) never both
# take it.
_CLAIM: Final = f"""
UPDATE {BATCH_ITEMS} SET status = 'running', attempts = attempts + 1, lease_until = ?
WHERE batch_id = ? AND (status = 'pending' OR (status = 'running' AND lease_until < ?)) AND idx IN (
    SELECT idx FROM (SELECT idx FROM {BATCH_ITEMS} WHERE status = 'running' AND batch_id = ?
                     AND lease_until < ? ORDER BY idx LIMIT ?) AS expired
    UNION ALL
    SELECT idx FROM (SELECT idx FROM {BATCH_ITEMS} WHERE status = 'pending' AND batch_id = ?
                     ORDER BY idx LIMIT ?) AS waiting
    LIMIT ?)
RETURNING batch_id, idx, custom_id, body, attempts, result"""
_SENT: Final = (
    f"UPDATE {BATCH_ITEMS} SET result = ? "
    "WHERE batch_id = ? AND idx = ? AND status = 'running' AND attempts = ?"
)
_COMPLETE: Final = (
    f"UPDATE {BATCH_ITEMS} SET status = ?, result = ?, ledger_row = ?, body = NULL, lease_until = NULL "
    "WHERE batch_id = ? AND idx = ? AND status = 'running' AND attempts = ?"
)


def _batch_of(values: Sequence[Any]) -> Batch:
    d = dict(zip(_BATCH_COLS, values, strict=True))
    for name in _JSON_COLS:
        d[name] = None if d[name] is None else orjson.loads(bytes(d[name]))
    d["times"] = d["times"] or {}
    return Batch(**d)


def _params_of(b: Batch) -> tuple[Any, ...]:
    return tuple(
        (None if getattr(b, c) is None else orjson.dumps(getattr(b, c))) if c in _JSON_COLS else getattr(b, c)
        for c in _BATCH_COLS
    )


class BatchStore:
    """The batches and their items over one DB-API connection (``_SqliteConn``/``PgConn``)."""

    def __init__(self, conn: _SqliteConn | PgConn) -> None:
        self._db = conn

    def _q(self, sql: str) -> str:
        return sql if self._db.placeholder == "?" else sql.replace("?", "%s")

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(self._db.transaction, fn, *args)

    # -- batches --------------------------------------------------------------------------
    async def create(self, batch: Batch, items: Sequence[NewItem]) -> None:
        def work(cur: Any) -> None:
            marks = ", ".join("?" for _ in _BATCH_COLS)
            cur.execute(
                self._q(f"INSERT INTO {BATCHES} ({', '.join(_BATCH_COLS)}) VALUES ({marks})"),
                _params_of(batch),
            )
            cur.executemany(
                self._q(
                    f"INSERT INTO {BATCH_ITEMS} (batch_id, idx, custom_id, body, status, attempts, result, "
                    "billed) VALUES (?, ?, ?, ?, ?, 0, ?, 0)"
                ),
                [(batch.id, i.idx, i.custom_id, i.body, i.status, i.result) for i in items],
            )

        await self._run(work)

    async def get(self, tenant: str | None, batch_id: str) -> Batch | None:
        def work(cur: Any) -> Batch | None:
            if tenant is None:
                cur.execute(self._q(_SELECT_BATCH + " WHERE id = ?"), (batch_id,))
            else:
                cur.execute(self._q(_SELECT_BATCH + " WHERE id = ? AND tenant = ?"), (batch_id, tenant))
            row = cur.fetchone()
            return None if row is None else _batch_of(row)

        result: Batch | None = await self._run(work)
        return result

    async def page(self, tenant: str, api: str, after: str | None, limit: int) -> list[Batch]:
        """The tenant's batches of ``api``, newest first, after the batch ``after`` (a cursor)."""

        def work(cur: Any) -> list[Batch]:
            sql = _SELECT_BATCH + " WHERE tenant = ? AND api = ?"
            params: tuple[Any, ...] = (tenant, api)
            if after is not None:
                cur.execute(
                    self._q(f"SELECT created_at FROM {BATCHES} WHERE id = ? AND tenant = ?"), (after, tenant)
                )
                row = cur.fetchone()
                if row is not None:
                    sql += " AND (created_at < ? OR (created_at = ? AND id < ?))"
                    params += (row[0], row[0], after)
            cur.execute(self._q(sql + " ORDER BY created_at DESC, id DESC LIMIT ?"), (*params, limit))
            return [_batch_of(r) for r in cur.fetchall()]

        result: list[Batch] = await self._run(work)
        return result

    async def save(self, batch: Batch) -> None:
        """Write the batch's status, times, files and errors back."""

        def work(cur: Any) -> None:
            sets = ", ".join(f"{c} = ?" for c in _BATCH_COLS[1:])
            cur.execute(
                self._q(f"UPDATE {BATCHES} SET {sets} WHERE id = ?"), (*_params_of(batch)[1:], batch.id)
            )

        await self._run(work)

    async def set_upstream(self, batch_id: str, upstream: dict[str, Any] | None) -> None:
        """Only the provider's batch (a cancel saved meanwhile stays); None: none."""

        def work(cur: Any) -> None:
            data = None if upstream is None else orjson.dumps(upstream)
            cur.execute(self._q(f"UPDATE {BATCHES} SET upstream = ? WHERE id = ?"), (data, batch_id))

        await self._run(work)

    async def open_batches(self) -> list[Batch]:
        def work(cur: Any) -> list[Batch]:
            cur.execute(
                self._q(
                    _SELECT_BATCH
                    + " WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling')"
                    " ORDER BY created_at"
                )
            )
            return [_batch_of(r) for r in cur.fetchall()]

        result: list[Batch] = await self._run(work)
        return result

    async def counts(self, batch_id: str) -> dict[str, int]:
        def work(cur: Any) -> dict[str, int]:
            cur.execute(
                self._q(f"SELECT status, COUNT(*) FROM {BATCH_ITEMS} WHERE batch_id = ? GROUP BY status"),
                (batch_id,),
            )
            return {str(s): int(n) for s, n in cur.fetchall()}

        result: dict[str, int] = await self._run(work)
        return result

    async def unfinished(self, batch_id: str) -> bool:
        """Whether any item of the batch is pending or running (two index seeks, however big
        the batch: the runner asks every turn)."""

        def work(cur: Any) -> bool:
            cur.execute(
                self._q(
                    f"SELECT 1 FROM {BATCH_ITEMS} WHERE status IN ('pending', 'running') "
                    "AND batch_id = ? LIMIT 1"
                ),
                (batch_id,),
            )
            return cur.fetchone() is not None

        result: bool = await self._run(work)
        return result

    # -- items ----------------------------------------------------------------------------
    async def claim(self, batch_id: str, limit: int, lease_s: float) -> list[Claimed]:
        """Take up to ``limit`` items of the batch to run: pending ones, and running ones whose
        lease ran out (their worker died); each claim counts an attempt."""
        now = time.time()

        def work(cur: Any) -> list[Claimed]:
            params = (now + lease_s, batch_id, now, batch_id, now, limit, batch_id, limit, limit)
            cur.execute(self._q(_CLAIM), params)
            return [
                Claimed(str(b), int(i), c, bytes(body), int(a), sent is not None)
                for b, i, c, body, a, sent in cur.fetchall()
            ]

        result: list[Claimed] = await self._run(work)
        return result

    async def mark_sent(self, item: Claimed) -> None:
        """Record that this run's upstream call is about to begin (before it does)."""

        def work(cur: Any) -> None:
            note = orjson.dumps({"sent": item.attempt, "at": time.time()})
            cur.execute(self._q(_SENT), (note, item.batch_id, item.idx, item.attempt))

        await self._run(work)

    async def complete(self, item: Claimed, status: str, result: bytes, ledger_row: bytes | None) -> bool:
        """The item's result and ledger row, in one transaction; False when the claim is no
        longer this run's (its lease was taken over), and then nothing is written."""

        def work(cur: Any) -> bool:
            cur.execute(
                self._q(_COMPLETE), (status, result, ledger_row, item.batch_id, item.idx, item.attempt)
            )
            return bool(cur.rowcount)

        done: bool = await self._run(work)
        return done

    async def release(self, items: Sequence[Claimed]) -> None:
        """Claims given up (the gateway is stopping): pending again, at once."""

        def work(cur: Any) -> None:
            cur.executemany(
                self._q(
                    f"UPDATE {BATCH_ITEMS} SET status = 'pending', lease_until = NULL "
                    "WHERE batch_id = ? AND idx = ? AND status = 'running' AND attempts = ?"
                ),
                [(i.batch_id, i.idx, i.attempt) for i in items],
            )

        await self._run(work)

    async def unbilled(self, limit: int) -> list[tuple[str, int, bytes]]:
        """Finished items whose ledger row the ledger may not have yet: (batch, idx, row)."""

        def work(cur: Any) -> list[tuple[str, int, bytes]]:
            cur.execute(
                self._q(
                    f"SELECT batch_id, idx, ledger_row FROM {BATCH_ITEMS} WHERE billed = 0 "
                    "AND ledger_row IS NOT NULL LIMIT ?"
                ),
                (limit,),
            )
            return [(str(b), int(i), bytes(r)) for b, i, r in cur.fetchall()]

        result: list[tuple[str, int, bytes]] = await self._run(work)
        return result

    async def mark_billed(self, keys: Sequence[tuple[str, int]]) -> None:
        def work(cur: Any) -> None:
            cur.executemany(
                self._q(f"UPDATE {BATCH_ITEMS} SET billed = 1 WHERE batch_id = ? AND idx = ?"), keys
            )

        await self._run(work)

    async def close_pending(self, batch_id: str, status: str, result: bytes) -> int:
        """Every item not yet run ends as ``status`` (canceled, expired); running ones finish,
        but for those whose worker died (lease over)."""

        def work(cur: Any) -> int:
            cur.execute(
                self._q(
                    f"UPDATE {BATCH_ITEMS} SET status = ?, result = ?, body = NULL WHERE batch_id = ? "
                    "AND (status = 'pending' OR (status = 'running' AND lease_until < ?))"
                ),
                (status, result, batch_id, time.time()),
            )
            return int(cur.rowcount)

        n: int = await self._run(work)
        return n

    async def results(self, batch_id: str, after: int, limit: int) -> list[ItemResult]:
        """Finished items in input order, from index ``after`` on."""

        def work(cur: Any) -> list[ItemResult]:
            cur.execute(
                self._q(
                    f"SELECT idx, custom_id, status, result FROM {BATCH_ITEMS} WHERE batch_id = ? "
                    "AND idx >= ? AND status NOT IN ('pending', 'running') ORDER BY idx LIMIT ?"
                ),
                (batch_id, after, limit),
            )
            return [
                ItemResult(int(i), c, str(s), None if r is None else bytes(r))
                for i, c, s, r in cur.fetchall()
            ]

        result: list[ItemResult] = await self._run(work)
        return result

    def close(self) -> None:
        self._db.close()


class _SqliteConn:
    placeholder = "?"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection = connect(path, check_same_thread=False)

    def transaction(self, fn: Any, *args: Any) -> Any:
        with self._lock, immediate(self._conn):
            return fn(self._conn.cursor(), *args)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def open_batch_store(ledger_url: str) -> BatchStore | None:
    """The store in the ledger's own database (its migrations made the tables); None when the
    ledger is off (``none``)."""
    if ledger_url.strip().lower() == "none":
        return None
    if is_postgres_url(ledger_url):
        return BatchStore(PgConn(ledger_url))
    return BatchStore(_SqliteConn(ledger_path(ledger_url)))
