"""A real Prometheus (Debian package `prometheus`) on loopback, on a free port, scrapes a real
gateway after traffic and evaluates the dashboards' cost queries and the alert rules through its
HTTP API. The figures are checked against the gateway's own ledger."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml

from load_tests.mock_upstream import MockUpstream
from tests.conftest import service_unavailable
from tests.gateway_harness import RunningGateway, free_port, mock_policy, start_gateway
from tests.test_dashboards import COST_TITLE, RULES, chat, dashboard_exprs, drive_traffic, to_promql


class Prometheus:
    def __init__(self, tmp: Path, gateway_port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            service_unavailable("prometheus (Debian package prometheus)", "not on PATH")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "switchyard-gateway",
                    "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(timeout=10)
        self._wait_ready(tmp)

    def _wait_ready(self, tmp: Path) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            try:
                if self.client.get(self.url + "/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready within 30 s")

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = self.client.get(self.url + "/api/v1/query", params={"query": promql})
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (promql, body)
        result: list[dict[str, Any]] = (
            body["data"]["result"] if body["data"]["resultType"] == "vector" else []
        )
        return result

    def value(self, promql: str) -> float:
        result = self.query(promql)
        assert len(result) == 1, (promql, result)
        return float(result[0]["value"][1])

    def wait_for(self, promql: str, ok: Any, timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if ok(result):
                return result
            time.sleep(0.25)
        raise AssertionError(f"{promql}: still {result} after {timeout} s")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, RunningGateway]]:
    tmp_path = tmp_path_factory.mktemp("prom-live")
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=8) as mock:
        gateway = start_gateway(tmp_path, mock_policy(mock.base_url))
        try:
            yield from _scrape(tmp_path, gateway, mock)
        finally:
            gateway.stop()


def _scrape(
    tmp_path: Path, gateway: RunningGateway, mock: MockUpstream
) -> Iterator[tuple[Prometheus, RunningGateway]]:
    drive_traffic(gateway, mock)  # the counters exist before the first scrape...
    (tmp_path / "prom").mkdir()
    prom = Prometheus(tmp_path / "prom", gateway.port)
    try:
        prom.wait_for('up{job="switchyard-gateway"}', lambda r: r and r[0]["value"][1] == "1")
        prom.wait_for("switchyard_cost_usd_total", bool)
        for i in range(6):  # ...and grow between scrapes, so rate() and increase() see spend
            assert chat(gateway, f"more spend {i}", tenant=("team-a", "team-c")[i % 2]).status_code == 200
            time.sleep(0.4)
        mock.add_fault("status", model="mock-small", status=503, times=10)  # one failure between scrapes
        assert chat(gateway, "fails", model="code").status_code >= 500
        mock.clear_faults()
        ledger_cost = sum(
            Decimal(str(r["cost_usd"])) for r in gateway.ledger_rows() if r["cost_usd"] is not None
        )
        prom.wait_for(
            "sum(switchyard_cost_usd_total)",
            lambda r: r and math.isclose(float(r[0]["value"][1]), float(ledger_cost), rel_tol=1e-9),
        )
        time.sleep(2.5)  # a few more scrapes and rule evaluations
        yield prom, gateway
    finally:
        prom.stop()


def test_cost_queries_through_prometheus(scraped: tuple[Prometheus, RunningGateway]) -> None:
    prom, gw = scraped
    rows = gw.ledger_rows()
    spent = [r for r in rows if r["cost_usd"] is not None and Decimal(str(r["cost_usd"])) > 0]
    total = float(sum(Decimal(str(r["cost_usd"])) for r in spent))
    assert total > 0
    # Prometheus holds exactly the ledger's spend, per tenant and per model.
    assert math.isclose(prom.value("sum(switchyard_cost_usd_total)"), total, rel_tol=1e-9)
    by_tenant = {
        r["metric"]["tenant"]: float(r["value"][1])
        for r in prom.query("sum by (tenant) (switchyard_cost_usd_total)")
    }
    assert set(by_tenant) == {r["tenant"] for r in spent}
    for tenant, value in by_tenant.items():
        want = float(sum(Decimal(str(r["cost_usd"])) for r in spent if r["tenant"] == tenant))
        assert math.isclose(value, want, rel_tol=1e-9), tenant

    # Every query of the Cost dashboard evaluates; the spend ones return sane numbers.
    cost = {
        panel: to_promql(expr)
        for title, panel, expr in dashboard_exprs()
        if title == COST_TITLE and not panel.startswith("variable ")
    }
    for promql in cost.values():
        prom.query(promql)
    # The dashboard's variables, as Grafana asks for them (label values of a series).
    for label, metric in (("tenant", "switchyard_cost_usd_total"), ("route", "switchyard_requests_total")):
        r = prom.client.get(prom.url + f"/api/v1/label/{label}/values", params={"match[]": metric}).json()
        assert r["status"] == "success" and set(r["data"]) >= (
            {"team-a", "team-c"} if label == "tenant" else {"auto"}
        )
    range_spend = prom.value(cost["Spend (time range)"])
    assert 0 < range_spend <= 2 * total  # increase() extrapolates, within bounds
    rate = prom.value(cost["Spend rate"])
    assert 0 < rate < total * 3600  # $/h from the last 5 minutes of a few seconds' spend
    per_1k = prom.value(cost["$ per 1k requests"])
    costliest = max(float(Decimal(str(r["cost_usd"]))) for r in spent)
    assert 0 < per_1k <= 1000 * costliest
    models = {r["metric"]["model"] for r in prom.query(cost["Spend by model ($/h)"])}
    assert models == {r["served_model"] for r in spent}
    routes = {r["metric"]["route"] for r in prom.query(cost["Spend by route ($/h)"])}
    assert routes == {r["route"] for r in spent}
    tenants = prom.query(cost["Top tenants by spend (time range)"])
    assert {r["metric"]["tenant"] for r in tenants} == set(by_tenant)
    savings = prom.query(cost["Savings by cause (time range)"])
    assert savings and all(float(r["value"][1]) >= 0 for r in savings)
    assert {r["metric"]["cause"] for r in savings} >= {"exact_cache"}
    kinds = {r["metric"]["kind"] for r in prom.query(cost["Tokens by kind (per second)"])}
    assert {"input", "output"} <= kinds


def test_every_dashboard_and_rule_query_evaluates(scraped: tuple[Prometheus, RunningGateway]) -> None:
    prom, _ = scraped
    for _title, panel, expr in dashboard_exprs():
        if panel.startswith("variable "):
            continue  # label_values() is Grafana's, not PromQL
        prom.query(to_promql(expr))  # asserts status success: valid PromQL for a real Prometheus
    # The alert rules are loaded and evaluate cleanly against the gateway's real series.
    r = prom.client.get(prom.url + "/api/v1/rules").json()
    rules = [rule for g in r["data"]["groups"] for rule in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    for rule in rules:
        assert rule["health"] == "ok", rule
    ratio = prom.wait_for("switchyard:error_ratio:rate5m", bool)
    assert 0 < float(ratio[0]["value"][1]) < 0.5  # the one failure among the scraped requests
    firing = [
        a
        for a in prom.client.get(prom.url + "/api/v1/alerts").json()["data"]["alerts"]
        if a["state"] == "firing"
    ]
    assert firing == []  # "for" durations have not elapsed; nothing is wrong anyway
