"""Spend reports: grouping, exact sums, savings, time windows, rendering."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.report import (
    SAVINGS_COLUMNS,
    SERIES_COLUMNS,
    format_table,
    parse_since,
    savings_by_cause,
    spend,
    spend_series,
    to_json,
    total,
)
from gateway.ledger.store import SQLiteLedger
from tests.test_ledger_store import make_row

D = Decimal
NOW = 1_700_100_000.0


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    led = SQLiteLedger(path)
    led.start()
    rows = [
        # three cheap requests (one cache hit saving the whole baseline)
        make_row(1, ts=NOW - 10, cost_usd=D("0.0000000001"), baseline_cost_usd=D("0.0000000003")),
        make_row(2, ts=NOW - 20, cost_usd=D("0.0000000002"), baseline_cost_usd=None),
        make_row(
            3,
            ts=NOW - 30,
            cost_usd=D("0"),
            baseline_cost_usd=D("0.001"),
            cache_status="hit",
            cached_tokens=100,
        ),
        # one expensive model request, one failed unpriced request
        make_row(
            4,
            ts=NOW - 40,
            served_model="gpt-4o",
            tenant="beta",
            cost_usd=D("0.5"),
            baseline_cost_usd=D("0.5"),
            input_tokens=1000,
            output_tokens=500,
            route="smart",
        ),
        make_row(
            5,
            ts=NOW - 50,
            served_model=None,
            tenant="beta",
            cost_usd=None,
            baseline_cost_usd=None,
            input_tokens=None,
            output_tokens=None,
            status="error",
            http_status=502,
        ),
        # a cache hit as the pipeline writes it: nothing served it
        make_row(
            7,
            ts=NOW - 60,
            served_model=None,
            provider=None,
            cache_status="hit",
            tenant="gamma",
            cost_usd=D("0E-10"),
            baseline_cost_usd=D("0.002"),
        ),
        # outside a 1h window
        make_row(6, ts=NOW - 7200, cost_usd=D("9"), baseline_cost_usd=D("9")),
    ]
    for r in rows:
        led.write(r)
    led.close()
    return path


def test_parse_since() -> None:
    assert parse_since("90s") == 90
    assert parse_since("30m") == 1800
    assert parse_since("24h") == 86_400
    assert parse_since("7d") == 604_800
    assert parse_since("1.5h") == 5400
    for bad in ("", "24", "h", "24x", "-1h", "0h", "1 week", "24H"):
        with pytest.raises(ValueError, match="bad duration"):
            parse_since(bad)


def test_by_model_sorted_by_cost_with_exact_sums(ledger_file: Path) -> None:
    lines = spend(ledger_file, "model", parse_since("1h"), now=NOW)
    assert [ln.key for ln in lines] == ["gpt-4o", "gpt-4o-mini", "(cache)", None]
    assert lines[2].savings_usd == D("0.002")
    mini = lines[1]
    assert mini.requests == 3
    assert mini.cost_usd == D("0.0000000003")  # floats would not give this exactly
    assert mini.baseline_cost_usd == D("0.0010000003")
    # savings only where both known: (3e-10 - 1e-10) + (0.001 - 0) = 0.0010000002
    assert mini.savings_usd == D("0.0010000002")
    assert (mini.input_tokens, mini.cached_tokens, mini.output_tokens) == (300, 100, 60)
    failed = lines[3]
    assert (failed.requests, failed.errors, failed.unpriced) == (1, 1, 1)
    assert (failed.cost_usd, failed.input_tokens) == (D(0), 0)


def test_window_and_grouping(ledger_file: Path) -> None:
    everything = spend(f"sqlite:///{ledger_file}", "tenant", None)
    assert total(everything).requests == 7
    assert total(everything).cost_usd == D("9.5000000003")
    by_tenant = {ln.key: ln.requests for ln in spend(ledger_file, "tenant", 3600, now=NOW)}
    assert by_tenant == {"acme": 3, "beta": 2, "gamma": 1}
    routes = {ln.key for ln in spend(ledger_file, "route", 3600, now=NOW)}
    assert routes == {"auto", "smart"}
    assert {ln.key for ln in spend(ledger_file, "provider", 3600, now=NOW)} == {"openai", "(cache)"}
    assert {ln.key for ln in spend(ledger_file, "key", 3600, now=NOW)} == {"0123456789ab"}


def test_missing_or_empty_ledger(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "ledger.db"
    assert spend(missing, "model", None) == []
    assert not missing.exists()  # a report never creates a ledger
    empty = tmp_path / "empty.db"
    empty.touch()
    assert spend(empty, "model", 60) == []
    table = format_table([])
    assert "TOTAL" in table and len(table.splitlines()) == 3  # header, one rule, total
    assert to_json([], "model", "24h")["total"]["cost_usd"] == "0.0000000000"


def test_bad_group_is_refused(ledger_file: Path) -> None:
    with pytest.raises(ValueError):
        spend(ledger_file, "colour", None)  # type: ignore[arg-type]


def test_format_table_aligned_with_total(ledger_file: Path) -> None:
    lines = spend(ledger_file, "model", 3600, now=NOW)
    text = format_table(lines, "model")
    rows = text.splitlines()
    assert rows[0].split()[:2] == ["MODEL", "REQUESTS"]
    assert rows[-1].startswith("TOTAL")
    assert "(none)" in text
    assert "0.500000" in text
    assert rows[-1].split()[1] == "6"
    assert len({len(r) for r in rows if not r.startswith("-")}) <= 2  # right-aligned columns


def test_to_json_money_as_strings(ledger_file: Path) -> None:
    lines = spend(ledger_file, "model", 3600, now=NOW)
    obj = to_json(lines, "model", "1h")
    json.dumps(obj)  # serialisable as is
    assert obj["by"] == "model" and obj["since"] == "1h" and obj["since_seconds"] == 3600
    assert obj["lines"][1]["cost_usd"] == "0.0000000003"
    assert D(obj["total"]["cost_usd"]) == D("0.5000000003")
    assert obj["total"]["requests"] == 6


def test_cached_share_of_input_per_group(ledger_file: Path) -> None:
    lines = {ln.key: ln for ln in spend(ledger_file, "model", None, now=NOW)}
    for ln in lines.values():
        expected = ln.cached_tokens / ln.input_tokens if ln.input_tokens else None
        assert ln.cached_share == expected
    assert any(ln.cached_share for ln in lines.values())
    out = to_json(list(lines.values()), "model", None)
    by_key = {row["key"]: row["cached_share"] for row in out["lines"]}
    assert by_key == {
        k: None if ln.cached_share is None else round(ln.cached_share, 4) for k, ln in lines.items()
    }
    assert "CACHED%" in format_table(list(lines.values()), "model").splitlines()[0]


def _conversation_rows() -> list[LedgerRow]:
    """Three conversations (and requests outside any) with known cached shares."""
    rows = []
    for i, (conv, inp, cached, cost) in enumerate(
        [
            ("aaaaaaaaaaaaaaaa", 1000, 0, "0.0100000000"),  # turn 1 writes the cache
            ("aaaaaaaaaaaaaaaa", 1200, 900, "0.0020000001"),  # later turns read it
            ("aaaaaaaaaaaaaaaa", 1500, 1100, "0.0030000000"),
            ("bbbbbbbbbbbbbbbb", 400, 0, "0.5000000000"),  # expensive, never cached
            ("cccccccccccccccc", 100, 50, "0.0000000001"),
            (None, 5000, 4000, "9.0000000000"),  # no conversation: not in the report
        ]
    ):
        rows.append(
            make_row(
                100 + i,
                ts=NOW - 100 + i,
                conversation=conv,
                input_tokens=inp,
                cached_tokens=cached,
                cost_usd=D(cost),
                route="auto" if i % 2 else "smart",
            )
        )
    return rows


def test_cached_share_per_conversation_equals_the_raw_rows(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    led = SQLiteLedger(path)
    led.start()
    rows = _conversation_rows()
    for r in rows:
        led.write(r)
    led.close()
    lines = spend(path, "conversation", None)
    assert [ln.key for ln in lines] == ["bbbbbbbbbbbbbbbb", "aaaaaaaaaaaaaaaa", "cccccccccccccccc"]  # by cost
    for ln in lines:
        mine = [r for r in rows if r.conversation == ln.key]
        cached = sum(r.cached_tokens or 0 for r in mine)
        inp = sum(r.input_tokens or 0 for r in mine)
        assert (ln.requests, ln.cached_tokens, ln.input_tokens) == (len(mine), cached, inp)
        assert ln.cached_share == cached / inp
        assert ln.cost_usd == sum((r.cost_usd or D(0) for r in mine), D(0))
    assert lines[1].cached_share == pytest.approx(2000 / 3700)
    assert [ln.key for ln in spend(path, "conversation", None, top=2)] == [lines[0].key, lines[1].key]
    series = spend_series(path, "conversation", "day", None, top=1)
    assert [r["group"] for r in series] == ["bbbbbbbbbbbbbbbb"]
    assert tuple(series[0]) == SERIES_COLUMNS  # the header an empty report's CSV still writes
    saved = savings_by_cause(path, "day", None)
    assert saved and all(tuple(r) == SAVINGS_COLUMNS for r in saved)
    by_route = {ln.key: ln.cached_share for ln in spend(path, "route", None)}
    for route, share in by_route.items():
        mine = [r for r in rows if r.route == route]
        assert share == sum(r.cached_tokens or 0 for r in mine) / sum(r.input_tokens or 0 for r in mine)
    with pytest.raises(ValueError, match="top"):
        spend(path, "conversation", None, top=0)


def test_spend_cli_by_conversation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gateway.cli.admin import register

    path = tmp_path / "ledger.db"
    led = SQLiteLedger(path)
    led.start()
    for r in _conversation_rows():
        led.write(r)
    led.close()
    parser = argparse.ArgumentParser(prog="switchyard")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["spend", "--group-by", "conversation", "--since", "all", "--ledger", str(path)])
    assert args.func(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:6] == ["CONVERSATION", "REQUESTS", "ERRORS", "INPUT", "CACHED", "CACHED%"]
    assert table[3].split()[:6] == ["aaaaaaaaaaaaaaaa", "3", "0", "3,700", "2,000", "54%"]
    args = parser.parse_args(["spend", "--by", "conversation", "--top", "1", "--json", "--ledger", str(path)])
    args.since = "all"
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [ln["key"] for ln in out["lines"]] == ["bbbbbbbbbbbbbbbb"] and out["lines"][0][
        "cached_share"
    ] == 0.0
