"""The key-store factory: SQLite under ``SWITCHYARD_HOME``, or PostgreSQL next to the ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.limits.keys import KeyStore, KeyStoreBase
from gateway.limits.keys_pg import PostgresKeyStore

if TYPE_CHECKING:
    from gateway.config.settings import Settings

__all__ = ["open_key_store"]


def open_key_store(settings: Settings) -> KeyStoreBase:
    """The store ``settings`` call for: shared PostgreSQL tables when the ledger is PostgreSQL
    (so every replica sees the same keys), else the SQLite file under ``SWITCHYARD_HOME``."""
    if settings.ledger_url.startswith(("postgresql://", "postgres://")):
        return PostgresKeyStore(settings.ledger_url)
    return KeyStore(settings.keys_db)
