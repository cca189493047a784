"""The PostgreSQL connection for the ledger's writer and its reports.

psycopg is imported lazily (``pip install 'switchyard[postgres]'``), so a SQLite-only
installation never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg


def pg_connect(url: str, timeout: float = 5.0) -> psycopg.Connection[Any]:
    """A psycopg connection (imported lazily: ``pip install 'switchyard[postgres]'``)."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError("the PostgreSQL ledger needs psycopg: pip install 'switchyard[postgres]'") from exc
    return psycopg.connect(url, connect_timeout=max(1, int(timeout)), application_name="switchyard")
