"""`switchyard keys ...` and `switchyard spend` through ``gateway.cli.admin.register``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.cli.admin import register
from gateway.ledger.report import SAVINGS_COLUMNS, SERIES_COLUMNS
from gateway.ledger.store import SQLiteLedger
from gateway.limits.keys import KeyStore
from tests.test_ledger_store import make_row


class ParserExit(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ParserExit(message)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SWITCHYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SWITCHYARD_LEDGER", raising=False)
    return tmp_path / "home"


def run(*argv: str) -> int:
    parser = Parser(prog="switchyard")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    assert isinstance(code, int)
    return code


def test_keys_create_prints_only_the_key(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("keys", "create", "--tenant", "acme", "--name", "ci") == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    key = out.strip()
    assert key.startswith("sk-sy-")
    with KeyStore(home / "keys.db") as store:
        rec = store.lookup(key)
    assert rec is not None and rec.tenant == "acme" and rec.name == "ci"


def test_keys_create_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("keys", "create", "--tenant", "acme", "--json") == 0
    obj = json.loads(capsys.readouterr().out)
    assert set(obj) == {"key", "key_id", "tenant", "name", "created_at"}
    assert obj["tenant"] == "acme" and obj["name"] is None
    assert obj["created_at"].endswith("Z")
    with KeyStore(home / "keys.db") as store:
        assert store.lookup(obj["key"]) is not None


def test_keys_create_bad_tenant(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("keys", "create", "--tenant", "bad tenant!") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "invalid tenant" in captured.err


def test_keys_list_and_revoke(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with KeyStore(home / "keys.db") as store:
        _list_and_revoke(store, capsys)


def _list_and_revoke(store: KeyStore, capsys: pytest.CaptureFixture[str]) -> None:
    key_a, rec_a = store.create("acme", "one")
    key_b, rec_b = store.create("beta")
    capsys.readouterr()

    assert run("keys", "list") == 0
    out = capsys.readouterr().out
    assert rec_a.key_id in out and rec_b.key_id in out and "KEY_ID" in out
    assert key_a not in out and key_b not in out

    assert run("keys", "revoke", rec_a.key_id) == 0
    assert rec_a.key_id in capsys.readouterr().out
    assert run("keys", "revoke", rec_a.key_id, "--json") == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"key_id": rec_a.key_id, "revoked": False}
    assert "no active key" in captured.err

    assert run("keys", "list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)["keys"]
    assert [k["key_id"] for k in listed] == [rec_b.key_id]
    assert run("keys", "list", "--json", "--all") == 0
    listed = json.loads(capsys.readouterr().out)["keys"]
    assert {k["key_id"] for k in listed} == {rec_a.key_id, rec_b.key_id}
    assert next(k for k in listed if k["key_id"] == rec_a.key_id)["revoked_at"] is not None
    assert store.lookup(key_a) is None


def test_keys_without_subcommand_is_usage_error(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("keys") == 2
    assert "create" in capsys.readouterr().err


def test_spend_on_missing_ledger(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A home with no ledger (a mistyped SWITCHYARD_HOME) is said, never shown as zero spend."""
    for argv in (("spend", "--by", "model", "--since", "24h"), ("spend", "--json"), ("savings",)):
        assert run(*argv) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert f"no ledger at {home / 'ledger.db'}" in captured.err and "SWITCHYARD_HOME" in captured.err
    assert not home.exists()  # nothing created by looking


def test_spend_on_an_empty_ledger_is_zero(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home.mkdir()
    led = SQLiteLedger(home / "ledger.db")
    led.start()
    led.close()
    assert (home / "ledger.db").is_file()
    assert run("spend", "--json") == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["lines"] == [] and obj["total"]["requests"] == 0 and obj["total"]["cost_usd"] == "0.0000000000"
    # an empty report still has its header: a spreadsheet or `csv.DictReader` sees the columns
    assert run("spend", "--by", "model", "--bucket", "day", "--csv") == 0
    assert capsys.readouterr().out == ",".join(SERIES_COLUMNS) + "\n"
    assert run("savings", "--csv") == 0
    assert capsys.readouterr().out == "cause,bucket,requests,cost_usd,baseline_cost_usd,savings_usd\n"
    assert run("savings") == 0
    assert capsys.readouterr().out.split() == list(SAVINGS_COLUMNS)


def test_a_mistyped_variable_is_reported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    misspelt = "SWITCHYARD_HOME" + "E"  # spelt out, test_settings would flag the name as unknown
    env[misspelt] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "spend"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"unknown environment variable {misspelt} (did you mean SWITCHYARD_HOME?)" in proc.stderr


def test_spend_reports_the_ledger(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    led = SQLiteLedger(home / "ledger.db")
    led.start()
    now = time.time()
    led.write(make_row(1, ts=now - 60, cost_usd=Decimal("0.25"), tenant="acme"))
    led.write(make_row(2, ts=now - 120, cost_usd=Decimal("0.5"), tenant="beta"))
    led.write(make_row(3, ts=now - 3 * 86_400, cost_usd=Decimal("100"), tenant="old"))
    led.close()

    assert run("spend", "--by", "tenant", "--since", "24h", "--json") == 0
    obj = json.loads(capsys.readouterr().out)
    assert [ln["key"] for ln in obj["lines"]] == ["beta", "acme"]
    assert obj["total"]["cost_usd"] == "0.7500000000"
    assert obj["by"] == "tenant" and obj["since"] == "24h"

    assert run("spend", "--by", "tenant", "--since", "all") == 0
    out = capsys.readouterr().out
    assert "old" in out and "100.750000" in out.splitlines()[-1]

    assert run("spend", "--by", "model", "--since", "7d", "--ledger", f"sqlite:///{home / 'ledger.db'}") == 0
    assert "gpt-4o-mini" in capsys.readouterr().out


def test_spend_bad_input(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("spend", "--since", "yesterday") == 2
    assert "bad duration" in capsys.readouterr().err
    assert run("spend", "--ledger", "postgresql://127.0.0.1:1/x") == 1  # nothing listens there
    assert "PostgreSQL" in capsys.readouterr().err
    with pytest.raises(ParserExit):
        run("spend", "--by", "colour")
