"""The ledger factory: a ledger URL -> the SQLite store, the PostgreSQL store (with its local
outbox) or the ``NullLedger``."""

from __future__ import annotations

from pathlib import Path

from gateway.config.settings import default_home
from gateway.ledger.null import NullLedger
from gateway.ledger.postgres import PostgresLedger, outbox_path_for
from gateway.ledger.sqlite import is_postgres_url, ledger_path
from gateway.ledger.store import SQLiteLedger

__all__ = ["open_ledger"]


def open_ledger(
    url: str,
    *,
    home: Path | None = None,
    batch_size: int = 256,
    flush_interval: float = 0.05,
    max_pending: int = 1_000_000,
    conversation_spans: bool = False,
) -> SQLiteLedger:
    """A (not yet started) ledger for ``url``: ``sqlite:///<path>``, a plain path, or
    ``postgresql://...`` (then the local outbox is ``<home>/ledger-outbox.db``; ``home``
    defaults to ``$SWITCHYARD_HOME`` or ``~/.switchyard``). ``none``: a ``NullLedger``.
    ``conversation_spans``: keep the conversation spans (``ledger.spans``)."""
    if url.strip() == "none":
        return NullLedger()
    if is_postgres_url(url):
        if home is None:
            home = default_home()
        return PostgresLedger(
            url.strip(),
            outbox_path_for(home),
            batch_size=batch_size,
            flush_interval=flush_interval,
            max_pending=max_pending,
            conversation_spans=conversation_spans,
        )
    return SQLiteLedger(
        ledger_path(url),
        batch_size=batch_size,
        flush_interval=flush_interval,
        max_pending=max_pending,
        conversation_spans=conversation_spans,
    )
