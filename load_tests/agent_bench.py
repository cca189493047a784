"""Agent-traffic benchmark: the Anthropic Messages and OpenAI Responses surfaces beside chat,
in the same run.

    python -m load_tests.agent_bench [--quick] [--out DIR] [--gateway-root TREE]

Starts the zero-latency mock (OpenAI and Anthropic wire formats on one port) and
``switchyard serve`` pinned like ``load_tests.bench``, then for each protocol measures the
mock directly and through the gateway: chat completions, Messages passed through to an
Anthropic upstream, and Messages translated to a chat upstream. Reports the added p50
latency (open loop, non-streaming and streaming TTFT) and the closed-loop throughput ratio
per protocol; the pass-through should add no more than chat does. Writes
``agent-bench-<UTC>.json`` and ``.md`` under DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.bench import DEFAULT_OUT, _cpu_plan
from load_tests.bench_procs import GatewayProcess, MockProcess, machine_info
from load_tests.bench_report import save_report
from load_tests.loadgen import BodyFactory, LoadSpec, run_closed_loop, run_open_loop
from load_tests.mock_upstream import new_event_loop

POLICY = """\
server:
  auth: keys
providers:
  mock:
    type: openai
    base_url: http://127.0.0.1:{mock_port}/v1
    api_key: mock-key
  mock-anthropic:
    type: anthropic
    base_url: http://127.0.0.1:{mock_port}
    api_key: mock-key
  mock-oai:
    type: openai
    base_url: http://127.0.0.1:{mock_port}/v1
    api_key: mock-key
    responses: true
models:
  mock-small: {{provider: mock, upstream: mock-small, price: {{input: 0.15, output: 0.60}}}}
  claude: {{provider: mock-anthropic, upstream: claude-mock, price: {{input: 3, output: 15}}}}
  gpt: {{provider: mock-oai, upstream: mock-gpt, price: {{input: 1.25, output: 10}}}}
routes:
  bench:
    targets: [mock-small]
    cache: {{mode: "off"}}
  agent:
    targets: [claude]
    cache: {{mode: "off"}}
  native:
    targets: [gpt]
    cache: {{mode: "off"}}
"""


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    direct_model: str
    gateway_model: str
    protocol: str  # "chat" | "messages" | "responses"


CASES = (
    Case("chat", "/v1/chat/completions", "mock-small", "bench", "chat"),
    Case("messages_passthrough", "/v1/messages", "claude-mock", "agent", "messages"),
    Case("messages_to_chat", "/v1/messages", "", "mock-small", "messages"),  # no direct twin: vs chat's
    Case("responses_passthrough", "/v1/responses", "mock-gpt", "native", "responses"),
    Case("responses_to_chat", "/v1/responses", "", "bench", "responses"),  # vs chat's direct figures
)


def body(model: str, protocol: str, stream: bool, tag: str) -> BodyFactory:
    def make(i: int) -> bytes:
        text = f"request {tag} {i} lorem ipsum dolor"
        out: dict[str, Any] = {"model": model}
        if protocol == "responses":
            out["input"] = text
        else:
            out["messages"] = [{"role": "user", "content": text}]
        if protocol == "messages":
            out["max_tokens"] = 16
        if stream:
            out["stream"] = True
        return json.dumps(out).encode()

    return make


@dataclass(frozen=True)
class Load:
    quick: bool = False
    rps: float = 100.0  # open loop
    clients: int = 32  # closed loop


async def measure(url: str, case: Case, model: str, headers: dict[str, str], load: Load) -> dict[str, Any]:
    quick = load.quick
    open_s, closed_s = (3.0, 2.0) if quick else (8.0, 5.0)
    out: dict[str, Any] = {}
    for stream, key in ((False, "latency"), (True, "ttft")):
        tag = f"{case.name}-{key}-{secrets.token_hex(3)}"
        spec = LoadSpec(url=url + case.path, body=body(model, case.protocol, stream, tag), headers=headers,
                        stream=stream, duration_s=open_s, timeout_s=10.0, drain_s=5.0)  # fmt: skip
        report = (await run_open_loop(spec, load.rps)).to_dict()
        out[key + "_p50_ms"] = report["ttft_ms" if stream else "latency_ms"]["p50"]
        out[key + "_errors"] = sum(report["errors"].values())
    tag = f"{case.name}-closed-{secrets.token_hex(3)}"
    spec = LoadSpec(url=url + case.path, body=body(model, case.protocol, False, tag), headers=headers,
                    duration_s=closed_s, timeout_s=10.0, drain_s=5.0)  # fmt: skip
    report = (await run_closed_loop(spec, load.clients)).to_dict()
    out["rps"], out["closed_errors"] = report["achieved_rps"], sum(report["errors"].values())
    return out


async def run(mock_url: str, gw_url: str, key: str, load: Load) -> list[dict[str, Any]]:
    direct_h = {
        "authorization": "Bearer mock-key",
        "x-api-key": "mock-key",
        "anthropic-version": "2023-06-01",
    }
    gw_h = {"authorization": f"Bearer {key}"}
    rows = []
    direct: dict[str, dict[str, Any]] = {}
    for case in CASES:
        if case.direct_model:
            direct[case.name] = await measure(mock_url, case, case.direct_model, direct_h, load)
        base = direct[case.name] if case.direct_model else direct["chat"]
        through = await measure(gw_url, case, case.gateway_model, gw_h, load)
        rows.append({"case": case.name, "direct": base, "gateway": through,
                     "added_p50_ms": _sub(through["latency_p50_ms"], base["latency_p50_ms"]),
                     "added_ttft_p50_ms": _sub(through["ttft_p50_ms"], base["ttft_p50_ms"]),
                     "rps_ratio": through["rps"] / base["rps"] if base["rps"] else None})  # fmt: skip
    return rows


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Agent traffic: Messages and Responses beside chat (same run)",
        "",
        f"- {report['timestamp']}; quick: {report['quick']}; pinning: {report['machine'].get('pinning')}",
        f"- open loop {report['rps']:g} req/s (p50), closed loop {report['clients']} clients (req/s);"
        " `messages_to_chat` and",
        "  `responses_to_chat` are compared with the direct chat figures (their upstream work is chat)",
        "",
        "| case | added p50 | added TTFT p50 | gateway req/s | direct req/s | ratio | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        g, d = r["gateway"], r["direct"]
        errors = g["latency_errors"] + g["ttft_errors"] + g["closed_errors"]
        lines.append(
            f"| {r['case']} | {_ms(r['added_p50_ms'])} | {_ms(r['added_ttft_p50_ms'])} | {g['rps']:,.0f} "
            f"| {d['rps']:,.0f} | x{r['rps_ratio']:.2f} | {errors} |"
        )
    return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"+{v:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.agent_bench")
    p.add_argument("--quick", action="store_true", help="short runs (about 30 s in all)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--rps", type=float, default=100.0, help="open-loop rate (lower on a shared machine)")
    p.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    p.add_argument(
        "--gateway-root",
        type=Path,
        default=None,
        help="run the gateway code of this source tree (e.g. a git worktree of an older commit)",
    )
    args = p.parse_args(argv)
    load = Load(args.quick, args.rps, args.clients)
    gw_cpus, load_cpus = _cpu_plan(False)
    machine = machine_info()
    machine["pinning"] = (
        {"gateway": sorted(gw_cpus), "mock_and_loadgen": sorted(load_cpus)} if gw_cpus and load_cpus else None
    )
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    started = time.time()
    mock = MockProcess.start(load_cpus)
    try:
        with tempfile.TemporaryDirectory(prefix="switchyard-agent-bench-") as home:
            gateway, key = GatewayProcess.start(
                Path(home),
                mock.port,
                secrets.token_hex(16),
                gw_cpus,
                policy_template=POLICY,
                root=args.gateway_root,
            )
            try:
                loop = new_event_loop()
                try:
                    rows = loop.run_until_complete(run(mock.url, gateway.url, key, load))
                finally:
                    loop.close()
            finally:
                gateway.stop()
    finally:
        mock.stop()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    report = {
        "kind": "switchyard-agent-bench",
        "timestamp": stamp,
        "quick": args.quick,
        "rps": args.rps,
        "clients": args.clients,
        "gateway_root": str(args.gateway_root) if args.gateway_root else None,
        "machine": machine,
        "rows": rows,
    }
    text = markdown(report)
    save_report(args.out / f"agent-bench-{stamp}", report, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
