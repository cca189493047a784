"""The ledger's SQLite layer: URL parsing, connection settings, schema migrations and the
mapping between ``LedgerRow`` and table rows. Used by the writer (``store``) and by reports."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Final, TypeVar

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.schema import (
    COLUMNS,
    SCHEMA_VERSION,
    SQLITE_INSERT_SQL,
    SQLITE_MIGRATIONS,
    TABLE,
    apply_migrations,
)

__all__ = ["COLUMNS", "SCHEMA_VERSION", "TABLE"]

BUSY_TIMEOUT_MS: Final = 5000
log = logging.getLogger(__name__)
MIGRATIONS: Final = SQLITE_MIGRATIONS
INSERT_SQL: Final = SQLITE_INSERT_SQL
_E10: Final = Decimal("1E10")

Param = str | int | float | None
T = TypeVar("T")


def ledger_path(url: str | Path) -> Path:
    """The SQLite file named by ``url``: ``sqlite:///abs/path``, ``sqlite:///rel`` or a plain
    path. A ``postgresql://`` URL is not a file: ValueError (see ``open.open_ledger``)."""
    if isinstance(url, Path):
        return url
    text = url.strip()
    if is_postgres_url(text):
        raise ValueError("a postgresql:// ledger URL names no SQLite file")
    if text.startswith("sqlite:"):
        rest = text[len("sqlite:") :]
        if not rest.startswith("///"):
            raise ValueError(f"bad SQLite ledger URL {url!r}: expected sqlite:///<path>")
        rest = rest[3:]
        if not rest or rest == ":memory:":
            raise ValueError(f"bad SQLite ledger URL {url!r}: a file path is required")
        # As in SQLAlchemy: everything after "sqlite:///" is the path, so an absolute path
        # gives four slashes (what Settings writes: f"sqlite:///{home / 'ledger.db'}").
        return Path(rest).expanduser()
    if "://" in text:
        raise ValueError(f"unsupported ledger URL {url!r}: use sqlite:///<path> or postgresql://...")
    if not text:
        raise ValueError("empty ledger URL")
    return Path(text).expanduser()


def is_postgres_url(url: str | Path) -> bool:
    return isinstance(url, str) and url.strip().startswith(("postgresql:", "postgres:"))


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient "database is locked"/"busy" errors."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def with_lock_retry(
    fn: Callable[[], T],
    *,
    attempts: int = 20,
    delay: float = 0.05,
    patience_s: float | None = None,
    waiting: Callable[[], None] | None = None,
) -> T:
    """Run ``fn``, retrying with backoff while SQLite says the database is locked: ``attempts``
    times, or (``patience_s``) for as long as that, however many attempts it takes: start-up
    work that may wait on another process's migration or back-fill (minutes on a big ledger).
    ``waiting`` is called once, at the first "locked" (after SQLite's own busy timeout)."""
    deadline = None if patience_s is None else time.monotonic() + patience_s
    i = 0
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            i += 1
            if not is_locked_error(exc):
                raise
            if time.monotonic() >= deadline if deadline is not None else i >= attempts:
                raise
            if i == 1 and waiting is not None:
                waiting()
            if i == attempts:
                log.warning("ledger: the database is locked by another process (migrating? back-filling?)")
            time.sleep(min(1.0, delay * (1.5 ** min(i - 1, 20))))


START_PATIENCE_S: Final = 1800.0  # how long a starting writer waits for another's start-up work


def connect(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    """Open ``path`` in autocommit mode (explicit transactions) with WAL settings."""
    conn = sqlite3.connect(
        str(path),
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=check_same_thread,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        with_lock_retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


def _e10(value: str | None) -> int | None:
    return None if value is None else int(Decimal(value) * _E10)


def migrate(
    conn: sqlite3.Connection, *, patience_s: float | None = None, waiting: Callable[[], None] | None = None
) -> int:
    """Bring the schema up to ``SCHEMA_VERSION``; safe when several processes race
    (``patience_s``, ``waiting``: see ``with_lock_retry``)."""
    conn.create_function("sy_e10", 1, _e10, deterministic=True)

    def run() -> int:
        with immediate(conn):
            return apply_migrations(conn.execute, SQLITE_MIGRATIONS, "?")

    return with_lock_retry(run, patience_s=patience_s, waiting=waiting)


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE``: the write lock up front) on an autocommit
    connection: committed when the block ends, rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _money(value: Decimal | None) -> str | None:
    return None if value is None else f"{value:f}"  # fixed point, exact: "0.0000270000"


def money_e10(value: Decimal | None) -> int | None:
    """``value`` in integer units of 1e-10 USD (the ledger's quantum; exact)."""
    return None if value is None else int(value.scaleb(10).to_integral_value())


def row_params(row: LedgerRow) -> tuple[Param, ...]:
    """The INSERT parameters for ``row``, in ``SQLITE_COLUMNS`` order."""
    return (
        row.request_id,
        row.ts,
        row.tenant,
        row.key_id,
        row.route,
        row.requested_model,
        row.served_model,
        row.provider,
        row.endpoint,
        int(row.stream),
        row.cache_status,
        row.input_tokens,
        row.cached_tokens,
        row.cache_write_tokens,
        row.output_tokens,
        int(row.usage_estimated),
        _money(row.cost_usd),
        _money(row.baseline_cost_usd),
        row.latency_ms,
        row.ttft_ms,
        row.status,
        row.http_status,
        row.error_code,
        row.attempts,
        row.classifier_score,
        row.savings_cause,
        row.route_decision,
        row.conversation,
        row.batch_id,
        row.compressed_tokens,
        row.task,
        money_e10(row.cost_usd),
        money_e10(row.baseline_cost_usd),
    )


def row_from_db(values: Iterable[object]) -> LedgerRow:
    """Rebuild a ``LedgerRow`` from a ``SELECT <COLUMNS>`` result row."""
    d = dict(zip(COLUMNS, values, strict=True))
    for name in ("cost_usd", "baseline_cost_usd"):
        raw = d[name]
        d[name] = None if raw is None else Decimal(str(raw))
    d["stream"] = bool(d["stream"])
    d["usage_estimated"] = bool(d["usage_estimated"])
    return LedgerRow(**d)  # type: ignore[arg-type]


def read_rows(conn: sqlite3.Connection, *, since: float | None = None) -> list[LedgerRow]:
    """Every ledger row (optionally with ``ts >= since``) in insertion order."""
    sql = f"SELECT {', '.join(COLUMNS)} FROM {TABLE}"
    params: tuple[float, ...] = ()
    if since is not None:
        sql += " WHERE ts >= ?"
        params = (since,)
    return [row_from_db(r) for r in conn.execute(sql + " ORDER BY id", params)]
