"""The most expensive conversations of a window (schema v5: picked from the covering ts index,
then summed from their rows) equal the top N computed from the rows themselves, on SQLite and
PostgreSQL: every sum, ties broken by id, unpriced conversations last, rows without a
conversation left out, windows cut inside hours, one tenant, a series by day."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.report import spend, spend_series
from tests.pg_support import scratch_schema
from tests.test_ledger_rollups import DAY, HOUR, T0, _write_postgres, _write_sqlite
from tests.test_ledger_store import make_row

D = Decimal


def conversation_rows(n: int = 600, seed: int = 21) -> list[LedgerRow]:
    """Rows of 40 conversations (and some without one) over two days; conversation 39 is
    never priced, 37 and 38 cost the same to the 1e-10 USD."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        conv = rnd.choice([None, *range(40)])
        cost: Decimal | None = D(rnd.randint(0, 10**8)).scaleb(-10)
        if conv in (37, 38):
            cost = D("0.0000012345")
        if conv == 39 or rnd.random() < 0.03:
            cost = None
        out.append(
            make_row(
                i,
                ts=T0 + rnd.random() * 2 * DAY,
                tenant=rnd.choice(["acme", "beta"]),
                conversation=None if conv is None else f"c0ffee{conv:010d}",
                cost_usd=cost,
                baseline_cost_usd=None if cost is None else cost * 2,
                input_tokens=rnd.randint(1, 900),
                status="ok" if rnd.random() < 0.9 else "error",
            )
        )
    return out


def truth(
    rows: list[LedgerRow], since: float, until: float, top: int, tenant: str | None = None
) -> list[tuple[Any, ...]]:
    """(conversation, requests, errors, input tokens, cost) of the top ``top`` by cost."""
    sums: dict[str, list[Any]] = {}
    for r in rows:
        if r.conversation is None or not since <= r.ts < until or tenant not in (None, r.tenant):
            continue
        s = sums.setdefault(r.conversation, [0, 0, 0, None])
        s[0] += 1
        s[1] += r.status != "ok"
        s[2] += r.input_tokens or 0
        if r.cost_usd is not None:
            s[3] = r.cost_usd if s[3] is None else s[3] + r.cost_usd
    order = sorted(sums, key=lambda c: (sums[c][3] is None, -(sums[c][3] or 0), c))[:top]
    return [(c, *sums[c][:3], sums[c][3] or D(0)) for c in order]


def got(
    url: str | Path, since: float, until: float, top: int, tenant: str | None = None
) -> list[tuple[Any, ...]]:
    lines = spend(url, "conversation", until - since, now=until, until=until, top=top, tenant=tenant)
    return [(ln.key, ln.requests, ln.errors, ln.input_tokens, ln.cost_usd) for ln in lines]


WINDOWS = [
    (T0, T0 + 2 * DAY),
    (T0 + 0.3 * HOUR, T0 + DAY + 5.5 * HOUR),
    (T0 + 3 * HOUR + 1, T0 + 3 * HOUR + 900),
]


def _check(url: str | Path, rows: list[LedgerRow]) -> None:
    for since, until in WINDOWS:
        for top in (1, 5, 38, 40, 100):
            assert got(url, since, until, top) == truth(rows, since, until, top), (since, until, top)
        assert got(url, since, until, 7, "beta") == truth(rows, since, until, 7, "beta")
    whole = truth(rows, T0, T0 + 2 * DAY, 40)
    assert [c for c, *_ in whole[-3:]] == ["c0ffee0000000037", "c0ffee0000000038", "c0ffee0000000039"]
    series = spend_series(url, "conversation", "day", 2 * DAY, now=T0 + 2 * DAY, until=T0 + 2 * DAY, top=4)
    top4 = {c for c, *_ in truth(rows, T0, T0 + 2 * DAY, 4)}
    assert {r["group"] for r in series} == top4
    for label, lo in (("2025-11-30", T0), ("2025-12-01", T0 + DAY)):
        want = {c: cost for c, _, _, _, cost in truth(rows, lo, lo + DAY, 40) if c in top4}
        have = {r["group"]: D(r["cost_usd"]) for r in series if r["bucket"] == label}
        assert have == want, label


def test_sqlite_top_conversations_are_exact(tmp_path: Path) -> None:
    rows = conversation_rows()
    path = tmp_path / "ledger.db"
    _write_sqlite(path, rows)
    _check(path, rows)


@pytest.mark.postgres
def test_postgres_top_conversations_are_exact(tmp_path: Path) -> None:
    rows = conversation_rows(seed=22)
    with scratch_schema("sy_conv") as url:
        _write_postgres(url, tmp_path / "outbox.db", rows)
        _check(url, rows)
