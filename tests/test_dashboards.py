"""deploy/grafana: the dashboards are valid Grafana JSON, provisioned the way deploy/compose
mounts them, and every metric their PromQL (and the alert rules') names is exported by a running
gateway after traffic.

Metrics that exist only under conditions this test does not create are checked against their
definitions in gateway/telemetry/metrics.py instead (CONDITIONAL below, each with its reason)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import Metrics
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "switchyard-alerts.yml"
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"

COST_TITLE = "Switchyard — Cost"
PERF_TITLE = "Switchyard — Performance"

# Exported only under conditions that plain traffic through the mock upstream does not create.
CONDITIONAL = {
    "switchyard_engine_up": "a self-hosted engine probed by the gateway (engine issue)",
    "switchyard_engine_queue_depth": "a self-hosted engine probed by the gateway",
    "switchyard_engine_running": "a self-hosted engine probed by the gateway",
    "switchyard_engine_kv_cache_usage": "a self-hosted engine probed by the gateway",
    "switchyard_engine_prefix_cache_hit_ratio": "a self-hosted engine probed by the gateway",
    "switchyard_engine_ttft_seconds": "a self-hosted engine probed by the gateway",
    "switchyard_engine_spillovers_total": "an engine saturated enough to spill over",
    "switchyard_budget_remaining_usd": "budgets configured for a key, tenant or route",
    "switchyard_ledger_outbox_rows": "a PostgreSQL ledger (the local outbox)",
    "switchyard_load_shed_total": "a gateway at capacity shedding load",
    "switchyard_cache_backend_errors_total": "a failing Redis cache backend",
    # The mock policy has no semantic_cache and no classifier route: both need an embedding model
    # loaded in the gateway (sentence-transformers + torch), too heavy for this traffic test.
    "switchyard_semantic_lookup_seconds_bucket": "a route with semantic_cache enabled (an embedder)",
    "switchyard_route_decisions_total": "a route with a complexity classifier (an embedder)",
}

GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "10m",
    "$tenant": ".*",
    "$route": ".*",
    "$engine": ".*",
}

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "Inf",
    "NaN",
    "inf",
    "nan",
}


# ------------------------------------------------------------------------------ helpers
def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL as Grafana stores it) for every query."""
    out = []
    for d in load_dashboards().values():
        for p in panels(d):
            for t in p.get("targets", []):
                out.append((d["title"], p["title"], t["expr"]))
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                out.append((d["title"], f"variable {v['name']}", v["query"]["query"]))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(r.get("alert") or r["record"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def recording_rules() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def to_promql(expr: str) -> str:
    """Grafana's variables replaced the way Grafana would (All selected)."""
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric (and recording rule) names a PromQL expression reads."""
    expr = to_promql(expr) if "$" in expr else expr
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*\w+\s*\)\s*", expr)
    if m:  # a Grafana variable query
        return {m.group(1)}
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(r"\b(offset\s+-?|@\s*)[0-9a-z.()]+", " ", s)  # offset 5m, @ start()
    s = re.sub(r"(?<![A-Za-z0-9_:.])\d+(\.\d+)?([eE][+-]?\d+)?", " ", s)  # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        rest = s[m.end() :].lstrip()
        if rest.startswith("(") or m.group(0) in PROMQL_WORDS:
            continue  # a function or an operator keyword
        names.add(m.group(0))
    return names


def defined_sample_names() -> set[str]:
    """Every sample name gateway/telemetry/metrics.py can export (counters as *_total, histograms
    as *_bucket/_count/_sum)."""
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def exported_sample_names(text: str) -> dict[str, int]:
    """Sample name -> number of samples in a /metrics page."""
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0) + 1
    return out


def chat(
    gw: RunningGateway, content: str, *, model: str = "auto", tenant: str = "team-a", **extra: Any
) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return gw.post("/v1/chat/completions", body, tenant=tenant)


def drive_traffic(gw: RunningGateway, mock: MockUpstream) -> None:
    """Misses, exact-cache hits, streams, several tenants and routes, an upstream failure that
    falls back, an embeddings call and refused requests."""
    for tenant in ("team-a", "team-c"):
        for _ in range(3):  # one miss, then exact-cache hits (temperature 0)
            r = chat(gw, f"what does {tenant} pay?", tenant=tenant, temperature=0)
            assert r.status_code == 200, r.text
    for i in range(3):
        assert chat(gw, f"question {i}", model="code").status_code == 200
    r = chat(gw, "stream please", stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and "[DONE]" in r.text
    mock.add_fault("status", model="mock-small", status=500, times=2)  # small fails, large answers
    r = chat(gw, "fall back", tenant="team-c")
    assert r.status_code == 200 and r.headers["x-switchyard-model"] == "large", r.text
    mock.add_fault("status", model="mock-small", status=503, times=10)  # route code: no fallback
    r = chat(gw, "fails", model="code")
    assert r.status_code >= 500, r.text
    mock.clear_faults()
    r = gw.post("/v1/embeddings", {"model": "embed", "input": "hello"})
    assert r.status_code == 200, r.text
    assert chat(gw, "unknown", model="no-such-model").status_code == 404
    assert chat(gw, "not allowed", model="restricted", tenant="team-b").status_code == 403


# ------------------------------------------------------------------------------ structure
def test_committed_dashboards_are_the_generators_output() -> None:
    """deploy/grafana/generate.py is the source; the JSON files are its output, unedited."""
    spec = importlib.util.spec_from_file_location(
        "sy_dashboards", ROOT / "deploy" / "grafana" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered: dict[str, str] = module.render()
    assert sorted(rendered) == sorted(p.name for p in DASHBOARDS.glob("*.json"))
    for name, text in rendered.items():
        assert (DASHBOARDS / name).read_text(encoding="utf-8") == text, (
            f"{name} differs from deploy/grafana/generate.py's output: run it"
        )


def test_two_dashboards_with_the_required_panels() -> None:
    boards = {d["title"]: d for d in load_dashboards().values()}
    assert set(boards) == {COST_TITLE, PERF_TITLE}
    required = {
        COST_TITLE: [
            "Spend by model ($/h)",
            "Spend by tenant ($/h)",
            "Spend by route ($/h)",
            "Savings by cause ($/h)",
            "$ per 1k requests",
            "Budget burn ($/h)",
            "Top keys: least budget left",
        ],
        PERF_TITLE: [
            "Requests by status (per second)",
            "Error ratio",
            "Request latency",
            "Time to first token (streams)",
            "Gateway overhead",
            "Cache hit ratio",
        ],
    }
    for title, wanted in required.items():
        have = {p["title"] for p in panels(boards[title])}
        assert set(wanted) <= have, set(wanted) - have


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_dashboard_is_well_formed(name: str) -> None:
    d = json.loads((DASHBOARDS / name).read_text())
    assert d["uid"] == name.removesuffix(".json") and len(d["uid"]) <= 40
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    var_names = {v["name"] for v in d["templating"]["list"]}
    assert "datasource" in var_names
    ds_var = next(v for v in d["templating"]["list"] if v["name"] == "datasource")
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    occupied: set[tuple[int, int]] = set()
    for p in panels(d):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] >= 1, p["title"]
        cells = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()
            for var in re.findall(r"\$\w+", t["expr"]):
                assert var in GRAFANA_VARS and (var.startswith("$__") or var[1:] in var_names), var


def test_provisioning_matches_compose_mounts() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "switchyard.yaml").read_text())
    (provider,) = prov["providers"]
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    assert f"../grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    # the datasource URL comes from the environment compose sets
    var = re.fullmatch(r"\$\{(\w+)\}", source["url"])
    assert var and grafana["environment"][var.group(1)] == "http://prometheus:9090"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"]) and (DASHBOARDS / Path(home).name).is_file()


# ------------------------------------------------------------------------------ metric names
def test_metric_name_extraction() -> None:
    expr = (
        'sum by (model) (rate(switchyard_cost_usd_total{tenant=~"$tenant", route=~"a|b"}[$__rate_interval])) * 3600'
        " / on (model) group_left sum(switchyard_requests_total offset 5m) > 1e3 and "
        "histogram_quantile(0.95, sum by (le) (rate(switchyard_x_bucket[5m]))) or vector(0) + switchyard:rec"
    )
    assert metric_names(expr) == {
        "switchyard_cost_usd_total",
        "switchyard_requests_total",
        "switchyard_x_bucket",
        "switchyard:rec",
    }
    assert metric_names("label_values(switchyard_engine_up, engine)") == {"switchyard_engine_up"}


def test_queries_read_only_switchyard_metrics() -> None:
    exprs = [e for _, _, e in dashboard_exprs()] + [e for _, e in rule_exprs()]
    assert len(exprs) >= 40
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        for name in names:
            assert name.startswith(("switchyard_", "switchyard:")), (name, expr)


def test_conditional_metrics_are_defined_and_used() -> None:
    defined = defined_sample_names()
    used = {n for _, _, e in dashboard_exprs() for n in metric_names(e)}
    used |= {n for _, e in rule_exprs() for n in metric_names(e)}
    for name in CONDITIONAL:
        assert name in defined, f"{name} is not defined in gateway/telemetry/metrics.py"
        assert name in used, f"{name} is listed as conditional but no query uses it"


def test_every_metric_is_exported_by_a_running_gateway(gateway: RunningGateway, mock: MockUpstream) -> None:
    drive_traffic(gateway, mock)
    page = gateway.get("/metrics")
    assert page.status_code == 200
    exported = exported_sample_names(page.text)
    defined = defined_sample_names()
    records = recording_rules()
    queries = [(f"{d} / {p}", e) for d, p, e in dashboard_exprs()] + [
        (f"rule {n}", e) for n, e in rule_exprs()
    ]
    checked_live = set()
    for where, expr in queries:
        for name in metric_names(expr):
            if name in records:
                continue  # defined in the rules file (checked by promtool)
            if name in CONDITIONAL:
                assert name in defined, (where, name)
                continue
            assert exported.get(name, 0) > 0, (
                f"{where}: {name} is not in the gateway's /metrics after traffic"
            )
            checked_live.add(name)
    # The cost and performance core really was exported, with the labels the panels group by.
    assert {
        "switchyard_cost_usd_total",
        "switchyard_requests_total",
        "switchyard_tokens_total",
        "switchyard_request_duration_seconds_bucket",
        "switchyard_time_to_first_token_seconds_bucket",
        "switchyard_gateway_overhead_seconds_bucket",
        "switchyard_cache_results_total",
        "switchyard_upstream_errors_total",
        "switchyard_rejections_total",
    } <= checked_live
    families = {f.name: f for f in text_string_to_metric_families(page.text)}
    tenants = {
        s.labels["tenant"] for s in families["switchyard_cost_usd"].samples if s.name.endswith("_total")
    }
    assert tenants == {"team-a", "team-c"}


# ------------------------------------------------------------------------------ new panels' values
def test_routing_and_semantic_panels_compute_the_right_values(tmp_path: Path) -> None:
    """The routing-share, semantic hit-ratio and semantic lookup-time panels, evaluated by
    `promtool test rules` on known series: a wrong grouping or ratio gives a different number.
    (The live test cannot: its gateway has no classifier route and no semantic cache.)"""
    from tests.test_prometheus_rules import promtool

    perf = {p["title"]: p for d in load_dashboards().values() if d["title"] == PERF_TITLE for p in panels(d)}

    def exprs(title: str) -> list[str]:
        return [to_promql(t["expr"].replace("$__rate_interval", "5m")) for t in perf[title]["targets"]]

    (share,) = exprs("Routing decisions by route (share)")
    exact, semantic = exprs("Cache hit ratio")
    p50, p95 = exprs("Semantic cache lookup time")
    decisions = "switchyard_route_decisions_total"
    lookup = 'switchyard_semantic_lookup_seconds_bucket{route="auto",le="%s"}'
    series = {
        f'{decisions}{{route="auto",decision="cheap"}}': "0+3x20",
        f'{decisions}{{route="auto",decision="strong"}}': "0+1x20",
        f'{decisions}{{route="code",decision="strong"}}': "0+2x20",
        'switchyard_cache_results_total{result="hit"}': "0+5x20",
        'switchyard_cache_results_total{result="miss"}': "0+5x20",
        'switchyard_cache_results_total{result="semantic_hit"}': "0+1x20",
        'switchyard_cache_results_total{result="semantic_miss"}': "0+3x20",
        lookup % "0.01": "0+2x20",
        lookup % "0.05": "0+4x20",
        lookup % "+Inf": "0+4x20",
    }

    def case(expr: str, samples: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
        exp = [
            {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "}", "value": v}
            for lab, v in samples
        ]
        return {"expr": expr, "eval_time": "10m", "exp_samples": exp}

    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    case(
                        share,
                        [
                            ({"route": "auto", "decision": "cheap"}, 0.75),
                            ({"route": "auto", "decision": "strong"}, 0.25),
                            ({"route": "code", "decision": "strong"}, 1.0),
                        ],
                    ),
                    case(exact, [({}, 0.5)]),
                    case(semantic, [({}, 0.25)]),
                    case(p50, [({}, 0.01)]),  # rank 2 of 4 ends the first bucket
                    case(f"round({p95}, 0.0001)", [({}, 0.046)]),  # 0.01 + 0.04 * (3.8 - 2) / 2
                ],
            }
        ],
    }
    (tmp_path / "panels-test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run(
        [promtool(), "test", "rules", "panels-test.yml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
