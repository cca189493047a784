"""`switchyard keys create --daily-usd`, `budgets set|list`, `spend --group-by --bucket --csv`
and `savings` against the local key store and ledger of a gateway that served traffic."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest

from gateway.cli import main
from tests.gateway_harness import RunningGateway

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def served(gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> RunningGateway:
    monkeypatch.setenv("SWITCHYARD_HOME", str(gateway.home))
    monkeypatch.setenv("SWITCHYARD_POLICY", str(gateway.policy_path))
    for tenant in ("team-a", "team-b"):
        r = gateway.post(
            "/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0}, tenant=tenant
        )
        assert r.status_code == 200
    gateway.post("/v1/chat/completions", {"model": "auto", "messages": HELLO, "temperature": 0})  # cache hit
    gateway.app_state.services.ledger.flush(5.0)
    return gateway


def test_keys_create_with_budget_then_budgets_list_and_set(
    served: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--tenant", "team-z", "--daily-usd", "2.5", "--rpm", "9", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    key_id = created["key_id"]
    assert main(["budgets", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["budgets"]
    mine = [r for r in rows if r["name"] == key_id]
    assert mine == [
        {
            "scope": "key",
            "name": key_id,
            "period": "day",
            "period_id": mine[0]["period_id"],
            "limit_usd": "2.500000000",
            "spent_usd": "0.000000000",
            "remaining_usd": "2.500000000",
            "resets_at": mine[0]["resets_at"],
        }
    ]
    assert main(["budgets", "set", key_id, "--monthly-usd", "10", "--tpm", "500"]) == 0
    assert "monthly_usd=10" in capsys.readouterr().out
    assert main(["budgets", "list", "--csv"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["name"], r["period"], r["limit_usd"]) for r in parsed if r["name"] == key_id] == [
        (key_id, "month", "10.000000000")
    ]
    assert main(["budgets", "set", "nosuchkey", "--rpm", "5"]) == 1
    assert main(["budgets", "set", key_id, "--rpm", "0"]) == 2
    capsys.readouterr()


def test_budgets_list_shows_the_ledger_spend_of_a_tenant_budget(
    served: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    text = served.policy_path.read_text().replace("    rpm: 5\n", "    rpm: 5\n    budget: {daily_usd: 1}\n")
    served.policy_path.write_text(text)
    assert main(["budgets", "list", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["budgets"][0]
    spent = sum(
        Decimal(r["cost_usd"])
        for r in served.ledger_rows()
        if r["tenant"] == "team-b" and r["cost_usd"] is not None
    )
    assert (row["scope"], row["name"]) == ("tenant", "team-b")
    assert Decimal(row["spent_usd"]) == spent.quantize(Decimal("1E-9"), rounding="ROUND_CEILING")


def test_spend_by_bucket_as_csv_and_savings(
    served: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    total = sum(Decimal(r["cost_usd"]) for r in served.ledger_rows() if r["cost_usd"] is not None)
    assert main(["spend", "--group-by", "tenant", "--bucket", "day", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["group"] for r in rows} == {"team-a", "team-b"}
    assert sum(Decimal(r["cost_usd"]) for r in rows) == total
    assert main(["spend", "--group-by", "model", "--bucket", "hour", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bucket"] == "hour" and {r["group"] for r in out["spend"]} >= {"small"}
    assert main(["spend", "--by", "model"]) == 0  # the plain table still works
    assert "TOTAL" in capsys.readouterr().out
    assert main(["savings", "--json"]) == 0
    savings = {r["cause"]: Decimal(r["savings_usd"]) for r in json.loads(capsys.readouterr().out)["savings"]}
    assert savings["exact_cache"] > 0
    assert main(["savings", "--csv", "--bucket", "day"]) == 0
    assert "exact_cache" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["spend", "--bucket", "week"])
    assert info.value.code == 2
    capsys.readouterr()
