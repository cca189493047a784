"""Writes the Grafana dashboards "Switchyard — Cost" and "Switchyard — Performance" as JSON.

    python deploy/grafana/generate.py            # rewrites deploy/grafana/dashboards/*.json
    cp deploy/grafana/dashboards/*.json deploy/helm/switchyard/files/dashboards/

Edit the panels here, not in the JSON: tests/test_dashboards.py checks that the committed
files are this script's output and that every metric a query names is exported by the gateway.
Every query reads the `datasource` variable, so the same file works with the compose
provisioning and with a Grafana sidecar on Kubernetes."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
F = '{tenant=~"$tenant", route=~"$route"}'  # spend/savings filters
R = '{route=~"$route"}'
USD = "currencyUSD"
Target = str | tuple[str, str]  # expr, or (expr, legend)


def variables(queries: list[tuple[str, str, str]]) -> dict[str, Any]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        }
    ]
    for name, label, query in queries:
        out.append(
            {
                "name": name,
                "label": label,
                "type": "query",
                "datasource": DS,
                "query": {"query": query, "refId": f"{name}-var"},
                "definition": query,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "refresh": 2,
                "sort": 1,
                "hide": 0,
                "options": [],
                "regex": "",
            }
        )
    return {"list": out}


class Board:
    """Lays panels out left to right, 24 columns wide, in rows."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        self.x = self.y = self.row_h = 0

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        pos = {"h": 1, "w": 24, "x": 0, "y": self.y}
        self.panels.append(
            {
                "id": next(self.ids),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": pos,
                "panels": [],
            }
        )
        self.y += 1

    def panel(
        self,
        kind: str,
        title: str,
        targets: list[Target],
        *,
        w: int = 12,
        h: int = 8,
        unit: str = "short",
        desc: str = "",
        stack: str = "none",
        options: dict[str, Any] | None = None,
        rename: dict[str, str] | None = None,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        p: dict[str, Any] = {
            "id": next(self.ids),
            "type": kind,
            "title": title,
            "description": desc,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "targets": [self._target(kind, i, t) for i, t in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": dict(options or {}),
        }
        if kind == "timeseries":
            p["fieldConfig"]["defaults"]["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 10,
                "stacking": {"mode": stack, "group": "A"},
            }
            p["options"]["legend"] = {
                "displayMode": "table",
                "placement": "right",
                "calcs": ["mean", "max"],
                "showLegend": True,
            }
            p["options"]["tooltip"] = {"mode": "multi", "sort": "desc"}
        if kind in ("stat", "bargauge"):
            p["options"]["reduceOptions"] = {"calcs": ["lastNotNull"], "fields": "", "values": False}
        if kind == "stat":
            p["options"].update({"colorMode": "value", "graphMode": "none", "textMode": "auto"})
        if kind == "table":
            organize = {"excludeByName": {"Time": True}, "renameByName": rename or {}}
            p["transformations"] = [{"id": "organize", "options": organize}]
        self.panels.append(p)
        self.x += w
        self.row_h = max(self.row_h, h)

    @staticmethod
    def _target(kind: str, i: int, t: Target) -> dict[str, Any]:
        expr, legend = t if isinstance(t, tuple) else (t, "")
        d: dict[str, Any] = {
            "refId": chr(65 + i),
            "datasource": DS,
            "expr": expr,
            "legendFormat": legend or "__auto",
            "range": True,
        }
        if kind in ("stat", "table", "bargauge"):
            d.update({"instant": True, "range": False})
        if kind == "table":
            d["format"] = "table"
        return d


def dashboard(
    uid: str, title: str, desc: str, tags: list[str], b: Board, queries: list[tuple[str, str, str]]
) -> Any:
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": tags,
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "panels": b.panels,
        "templating": variables(queries),
        "__requires": [{"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
    }


def quantiles(metric: str, qs: tuple[str, ...], sel: str = "") -> list[Target]:
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({metric}{sel}[{RI}])))", f"p{round(float(q) * 100)}")
        for q in qs
    ]


def cost() -> Any:
    b = Board()
    b.row("Spend")
    b.panel(
        "stat",
        "Spend (time range)",
        [f"sum(increase(switchyard_cost_usd_total{F}[$__range]))"],
        w=6,
        h=4,
        unit=USD,
        desc="USD spent on upstream calls and engines in the selected range (cache hits cost nothing).",
    )
    b.panel(
        "stat",
        "Savings (time range)",
        [f"sum(increase(switchyard_savings_usd_total{F}[$__range]))"],
        w=6,
        h=4,
        unit=USD,
        desc="What the routes' baseline models would have cost, minus what was spent.",
    )
    b.panel(
        "stat",
        "$ per 1k requests",
        [
            f"1000 * sum(increase(switchyard_cost_usd_total{F}[$__range]))"
            f" / sum(increase(switchyard_requests_total{R}[$__range]))"
        ],
        w=6,
        h=4,
        unit=USD,
        desc="Spend per thousand answered requests (cache hits included) in the range.",
    )
    b.panel(
        "stat",
        "Spend rate",
        [f"sum(rate(switchyard_cost_usd_total{F}[5m])) * 3600"],
        w=6,
        h=4,
        unit=USD,
        desc="USD per hour at the last 5 minutes' rate.",
    )
    for by in ("model", "tenant", "route"):
        b.panel(
            "timeseries",
            f"Spend by {by} ($/h)",
            [(f"sum by ({by}) (rate(switchyard_cost_usd_total{F}[{RI}])) * 3600", f"{{{{{by}}}}}")],
            unit=USD,
            stack="normal",
        )
    b.panel(
        "timeseries",
        "$ per 1k requests by route",
        [
            (
                f"1000 * sum by (route) (rate(switchyard_cost_usd_total{F}[{RI}]))"
                f" / sum by (route) (rate(switchyard_requests_total{R}[{RI}]))",
                "{{route}}",
            )
        ],
        unit=USD,
    )
    b.row("Savings")
    b.panel(
        "timeseries",
        "Savings by cause ($/h)",
        [(f"sum by (cause) (rate(switchyard_savings_usd_total{F}[{RI}])) * 3600", "{{cause}}")],
        unit=USD,
        stack="normal",
        desc="Exact cache, semantic cache, routing to a cheaper model, self-hosted engine: "
        "baseline cost minus cost.",
    )
    b.panel(
        "bargauge",
        "Savings by cause (time range)",
        [(f"sort_desc(sum by (cause) (increase(switchyard_savings_usd_total{F}[$__range])))", "{{cause}}")],
        unit=USD,
        options={"orientation": "horizontal", "displayMode": "gradient"},
    )
    b.panel(
        "timeseries",
        "Tokens by kind (per second)",
        [(f"sum by (kind) (rate(switchyard_tokens_total{R}[{RI}]))", "{{kind}}")],
    )
    b.panel(
        "timeseries",
        "Spend by provider ($/h)",
        [(f"sum by (provider) (rate(switchyard_cost_usd_total{F}[{RI}])) * 3600", "{{provider}}")],
        unit=USD,
        stack="normal",
    )
    b.row("Budgets and top spenders")
    budget_legend = "{{scope}}/{{name}} ({{period}})"
    b.panel(
        "timeseries",
        "Budget remaining",
        [
            (
                'min by (scope, name, period) (switchyard_budget_remaining_usd{scope=~"tenant|route|key"})',
                budget_legend,
            )
        ],
        unit=USD,
        desc="USD left in each budget; every gateway replica reports it, the lowest reading is shown.",
    )
    b.panel(
        "timeseries",
        "Budget burn ($/h)",
        [
            (
                "-3600 * min by (scope, name, period) (deriv(switchyard_budget_remaining_usd[30m]))",
                budget_legend,
            )
        ],
        unit=USD,
        desc="How fast each budget is used (last 30 minutes). SwitchyardBudgetBurnRate fires when it would "
        "empty a budget within 6 hours.",
    )
    b.panel(
        "table",
        "Top tenants by spend (time range)",
        [f"topk(10, sum by (tenant) (increase(switchyard_cost_usd_total{F}[$__range])))"],
        unit=USD,
        rename={"Value": "spend"},
    )
    b.panel(
        "table",
        "Top keys: least budget left",
        ['bottomk(10, min by (name, period) (switchyard_budget_remaining_usd{scope="key"}))'],
        unit=USD,
        desc="Keys with a budget, closest to running out. Spend per key over time: "
        "`switchyard spend --by key` (the ledger); keys are not metric labels.",
        rename={"name": "key", "Value": "remaining"},
    )
    b.panel(
        "table",
        "Top models by spend (time range)",
        [f"topk(10, sum by (model, provider) (increase(switchyard_cost_usd_total{F}[$__range])))"],
        unit=USD,
        rename={"Value": "spend"},
    )
    b.panel(
        "timeseries",
        "Ledger rows waiting",
        [
            ("sum by (instance) (switchyard_ledger_pending_rows)", "pending {{instance}}"),
            ("sum by (instance) (switchyard_ledger_outbox_rows)", "outbox {{instance}}"),
        ],
        desc="Rows queued for the ledger writer, and rows held in the durable outbox "
        "while PostgreSQL is away.",
    )
    return dashboard(
        "switchyard-cost",
        "Switchyard — Cost",
        "Spend, savings by cause, cost per request and budgets, from Switchyard's Prometheus metrics.",
        ["switchyard", "cost"],
        b,
        [
            ("tenant", "Tenant", "label_values(switchyard_cost_usd_total, tenant)"),
            ("route", "Route", "label_values(switchyard_requests_total, route)"),
        ],
    )


def performance() -> Any:
    errors = '{route=~"$route", status=~"error|stream_broken", provider!="none"}'
    b = Board()
    b.row("Traffic")
    b.panel("stat", "Requests/s", [f"sum(rate(switchyard_requests_total{R}[5m]))"], w=6, h=4, unit="reqps")
    b.panel(
        "stat",
        "Error ratio",
        [
            f"(sum(rate(switchyard_requests_total{errors}[5m])) or vector(0))"
            f" / sum(rate(switchyard_requests_total{R}[5m]))"
        ],
        w=6,
        h=4,
        unit="percentunit",
        desc="Failures after an upstream was chosen, over all answered requests (alert: over 0.1%).",
    )
    b.panel(
        "stat",
        "TTFT p95",
        [
            "histogram_quantile(0.95, sum by (le) "
            f"(rate(switchyard_time_to_first_token_seconds_bucket{R}[5m])))"
        ],
        w=6,
        h=4,
        unit="s",
    )
    b.panel(
        "stat",
        "Cache answered",
        [
            f'sum(rate(switchyard_requests_total{{route=~"$route", cache=~"hit|semantic_hit"}}[5m]))'
            f" / sum(rate(switchyard_requests_total{R}[5m]))"
        ],
        w=6,
        h=4,
        unit="percentunit",
        desc="Share of requests answered from the exact or semantic cache.",
    )
    b.panel(
        "timeseries",
        "Requests by status (per second)",
        [(f"sum by (status) (rate(switchyard_requests_total{R}[{RI}]))", "{{status}}")],
        unit="reqps",
        stack="normal",
    )
    b.panel(
        "timeseries",
        "Requests by model (per second)",
        [
            (
                f"sum by (model, provider) (rate(switchyard_requests_total{R}[{RI}]))",
                "{{model}} ({{provider}})",
            )
        ],
        unit="reqps",
        stack="normal",
    )
    b.panel(
        "timeseries",
        "Upstream errors by provider and code",
        [
            (
                f"sum by (provider, code) (rate(switchyard_upstream_errors_total[{RI}]))",
                "{{provider}} {{code}}",
            )
        ],
        unit="reqps",
    )
    b.panel(
        "timeseries",
        "Refused before any upstream call",
        [
            (f"sum by (code) (rate(switchyard_rejections_total[{RI}]))", "{{code}}"),
            (f"sum by (reason) (rate(switchyard_load_shed_total[{RI}]))", "shed: {{reason}}"),
        ],
        unit="reqps",
        desc="Auth, budget, rate limits and bad input (rejections), and load shedding at capacity.",
    )
    b.row("Latency")
    b.panel(
        "timeseries",
        "Request latency",
        quantiles("switchyard_request_duration_seconds_bucket", ("0.5", "0.95", "0.99"), R),
        unit="s",
    )
    b.panel(
        "timeseries",
        "Time to first token (streams)",
        quantiles("switchyard_time_to_first_token_seconds_bucket", ("0.5", "0.95", "0.99"), R),
        unit="s",
    )
    b.panel(
        "timeseries",
        "Gateway overhead",
        quantiles("switchyard_gateway_overhead_seconds_bucket", ("0.5", "0.99")),
        unit="s",
        desc="Latency Switchyard adds: total (TTFT for streams) minus time spent waiting on upstreams.",
    )
    b.panel(
        "timeseries",
        "TTFT p95 by route",
        [
            (
                f"histogram_quantile(0.95, sum by (le, route) "
                f"(rate(switchyard_time_to_first_token_seconds_bucket{R}[{RI}])))",
                "{{route}}",
            )
        ],
        unit="s",
    )
    b.row("Cache and upstreams")
    hits = "switchyard_cache_results_total"
    b.panel(
        "timeseries",
        "Cache hit ratio",
        [
            (
                f'sum(rate({hits}{{result="hit"}}[{RI}])) / sum(rate({hits}{{result=~"hit|miss"}}[{RI}]))',
                "exact",
            ),
            (
                f'sum(rate({hits}{{result="semantic_hit"}}[{RI}]))'
                f' / sum(rate({hits}{{result=~"semantic_hit|semantic_miss"}}[{RI}]))',
                "semantic",
            ),
        ],
        unit="percentunit",
        desc="Exact: hits over exact lookups. Semantic: hits over semantic lookups (made only after an "
        "exact miss, on routes with semantic_cache enabled).",
    )
    b.panel(
        "timeseries",
        "Semantic cache lookup time",
        quantiles("switchyard_semantic_lookup_seconds_bucket", ("0.5", "0.95"), R),
        unit="s",
        desc="Embed + vector search + verify, on routes with semantic_cache enabled (after an exact miss).",
    )
    b.panel(
        "timeseries",
        "Routing decisions by route (share)",
        [
            (
                f"sum by (route, decision) (rate(switchyard_route_decisions_total{R}[{RI}]))"
                f" / ignoring (decision) group_left"
                f" sum by (route) (rate(switchyard_route_decisions_total{R}[{RI}]))",
                "{{route}}: {{decision}}",
            )
        ],
        unit="percentunit",
        desc="Routes with a complexity classifier: share of requests first sent to each tier "
        "(strong, cheap, self_hosted; unscored when no score could be computed).",
    )
    b.panel(
        "timeseries",
        "Upstream attempts per request",
        [
            (
                f"sum by (model) (rate(switchyard_upstream_attempts_total[{RI}]))"
                f' / sum by (model) (rate(switchyard_requests_total{{provider!="cache"}}[{RI}]))',
                "{{model}}",
            )
        ],
        desc="Above 1: retries and fallbacks.",
    )
    b.panel(
        "timeseries",
        "Circuit breakers open",
        [("max by (model) (switchyard_circuit_open)", "{{model}}")],
        unit="bool",
    )
    b.panel(
        "timeseries",
        "Cache backend errors",
        [(f"sum by (backend) (rate(switchyard_cache_backend_errors_total[{RI}]))", "{{backend}}")],
        unit="reqps",
    )
    b.panel(
        "timeseries",
        "Exact cache memory",
        [("sum by (instance) (switchyard_exact_cache_bytes)", "{{instance}}")],
        unit="bytes",
        desc="What the in-process exact cache's answers hold (bounded by cache.max_bytes; with "
        "cache.backend: redis they live in Redis and this stays empty). Most of a gateway's memory "
        "growth after load is this.",
    )
    b.row("Self-hosted engines")
    rep = "{{engine}}/{{replica}}"
    sel = '{engine=~"$engine"}'
    for title, metric, unit, desc in (
        ("Engine queue (waiting requests)", "switchyard_engine_queue_depth", "short", "Alert over 10."),
        ("Engine running requests", "switchyard_engine_running", "short", ""),
        ("Engine KV cache usage", "switchyard_engine_kv_cache_usage", "percentunit", "Alert over 95%."),
        ("Engine prefix cache hit ratio", "switchyard_engine_prefix_cache_hit_ratio", "percentunit", ""),
        ("Engine TTFT (mean per probe interval)", "switchyard_engine_ttft_seconds", "s", ""),
    ):
        b.panel(
            "timeseries", title, [(f"max by (engine, replica) ({metric}{sel})", rep)], unit=unit, desc=desc
        )
    b.panel(
        "timeseries",
        "Engine spill-overs and replicas up",
        [
            (
                f"sum by (engine, reason) (rate(switchyard_engine_spillovers_total{sel}[{RI}]))",
                "spill {{engine}}: {{reason}}",
            ),
            (f"sum by (engine) (max by (engine, replica) (switchyard_engine_up{sel}))", "up {{engine}}"),
        ],
    )
    return dashboard(
        "switchyard-performance",
        "Switchyard — Performance",
        "Rate, errors, latency, TTFT, gateway overhead, cache, routing and engines, "
        "from Switchyard's Prometheus metrics.",
        ["switchyard", "performance"],
        b,
        [
            ("route", "Route", "label_values(switchyard_requests_total, route)"),
            ("engine", "Engine", "label_values(switchyard_engine_up, engine)"),
        ],
    )


def render() -> dict[str, str]:
    """File name -> JSON text."""
    boards = {"switchyard-cost.json": cost(), "switchyard-performance.json": performance()}
    return {name: json.dumps(board, indent=2, ensure_ascii=False) + "\n" for name, board in boards.items()}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "dashboards"
    for name, text in render().items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
