"""A private PostgreSQL schema per test on the shared server (127.0.0.1:5432 unless
SWITCHYARD_TEST_PG says otherwise), dropped afterwards. Skips outside CI when the server is
unreachable (fails under CI=true)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.ledger.pg import pg_connect
from tests.conftest import service_unavailable

PG = os.environ.get("SWITCHYARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def schema_url(schema: str, base: str = PG) -> str:
    """``base`` with its search_path set to ``schema``."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@contextmanager
def scratch_schema(prefix: str, base: str = PG) -> Iterator[str]:
    """Create a uniquely named schema, yield a URL that uses it, drop it at the end."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        admin = pg_connect(base)
    except Exception as exc:
        service_unavailable("PostgreSQL", str(exc))
    admin.autocommit = True
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield schema_url(schema, base)
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
