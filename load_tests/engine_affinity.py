"""Prefix affinity vs round robin on real vLLM replicas, measured by vLLM's own prefix cache
counters (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, summed over replicas).

    python -m load_tests.engine_affinity --replicas http://127.0.0.1:8001/v1,http://127.0.0.1:8002/v1 \\
        --model tiny [--prefixes 5 --rounds 4 --prefix-words 95 --concurrency 1]

For each balancing mode it starts `switchyard serve` (auth off) with the replicas as one engine,
sends ``prefixes`` shared contexts x ``rounds`` (fresh contexts per mode, so one mode never
warms the cache for the other) and writes load_tests/reports/engine_affinity.{json,md}.
`measure` is also what tests/test_engine_vllm.py runs against its own engines."""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.calibration import synthetic_prompt
from gateway.routing.engine_load import parse_vllm_metrics
from load_tests.bench_procs import ROOT, env_with_root, free_port, stop_process, switchyard_cmd
from load_tests.bench_report import save_report

MODES = ("round_robin", "prefix_affinity")
REPORTS = ROOT / "load_tests" / "reports"


def prefix_counters(replicas: list[str]) -> tuple[float, float]:
    """(hits, queries) summed over the replicas' /metrics."""
    hits = queries = 0.0
    for url in replicas:
        base = url[: -len("/v1")] if url.endswith("/v1") else url
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            s = parse_vllm_metrics(resp.read().decode())
        hits += s.prefix_hits or 0.0
        queries += s.prefix_queries or 0.0
    return hits, queries


def _chat(gateway_v1: str, key: str | None, route: str, system: str, user: str) -> dict[str, Any]:
    body = {
        "model": route,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 1,
        "temperature": 0,
    }
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(gateway_v1 + "/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=120) as resp:
        data: dict[str, Any] = json.load(resp)
        return data


def measure(
    gateway_v1: str,
    key: str | None,
    route: str,
    replicas: list[str],
    *,
    tag: str,
    prefixes: int = 5,
    rounds: int = 4,
    prefix_words: int = 95,
    concurrency: int = 1,
) -> dict[str, Any]:
    """Send prefixes x rounds requests (round by round) and read the replicas' prefix cache."""
    contexts = [synthetic_prompt(prefix_words, f"{tag}-{k}") for k in range(prefixes)]
    jobs = [(ctx, f"question {r}.{k}") for r in range(rounds) for k, ctx in enumerate(contexts)]
    hits0, queries0 = prefix_counters(replicas)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(lambda job: _chat(gateway_v1, key, route, *job), jobs))
    seconds = time.perf_counter() - t0
    hits1, queries1 = prefix_counters(replicas)
    usage = [a.get("usage") or {} for a in answers]
    per_request = [((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for u in usage]
    cached = sum(per_request)
    prompt = sum(u.get("prompt_tokens") or 0 for u in usage)
    queries = queries1 - queries0
    return {
        "requests": len(jobs),
        "prefix_cache_hits": hits1 - hits0,
        "prefix_cache_queries": queries,
        "hit_ratio": (hits1 - hits0) / queries if queries else None,
        "cached_tokens": cached,
        "requests_with_cache_hits": sum(1 for c in per_request if c > 0),
        "prompt_tokens": prompt,
        "seconds": round(seconds, 3),
    }


def policy_text(replicas: list[str], model: str, mode: str, prefix_chars: int) -> str:
    urls = ", ".join(f'"{u}"' for u in replicas)
    return f"""server: {{auth: none}}
providers:
  engine: {{type: openai, base_url: "{replicas[0]}", key_required: false, self_hosted: true,
           replicas: [{urls}], balance: {mode}, affinity: {{prefix_chars: {prefix_chars}}}}}
models:
  local: {{provider: engine, upstream: "{model}", price: {{input: 0, output: 0}}}}
routes:
  bench: {{targets: [local], retries: 0, attempt_timeout_s: 120, cache: {{mode: "off"}}}}
"""


def run_gateway_mode(args: argparse.Namespace, replicas: list[str], mode: str, home: Path) -> dict[str, Any]:
    home.mkdir(parents=True, exist_ok=True)
    policy = home / "policy.yaml"
    policy.write_text(policy_text(replicas, args.model, mode, args.prefix_chars))
    port = free_port()
    cmd = [*switchyard_cmd(), "serve", "--port", str(port), "--policy", str(policy), "--log-level", "warning"]
    env = env_with_root({"SWITCHYARD_HOME": str(home)})
    with (home / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"gateway did not start; see {home / 'gateway.log'}") from None
                time.sleep(0.2)
        return measure(
            url + "/v1", None, "bench", replicas, tag=f"{mode}-{time.time_ns()}", prefixes=args.prefixes,
            rounds=args.rounds, prefix_words=args.prefix_words, concurrency=args.concurrency,
        )  # fmt: skip
    finally:
        stop_process(proc)


def render(report: dict[str, Any]) -> str:
    lines = [
        "# Prefix affinity vs round robin (real vLLM replicas)",
        "",
        f"{len(report['replicas'])} replicas, {report['prefixes']} shared prefixes "
        f"x {report['rounds']} rounds, concurrency {report['concurrency']}.",
        "",
        "| balance | requests | prefix cache hit ratio | cached prompt tokens | seconds |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        r = report["results"][mode]
        ratio, cached = r["hit_ratio"], r["cached_tokens"]
        lines.append(f"| {mode} | {r['requests']} | {ratio:.3f} | {cached:,} | {r['seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", required=True, help="comma-separated OpenAI base URLs of vLLM replicas")
    ap.add_argument("--model", required=True, help="the model id the replicas serve")
    ap.add_argument("--prefixes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prefix-words", type=int, default=95, help="words per shared prefix")
    ap.add_argument("--prefix-chars", type=int, default=256, help="affinity.prefix_chars for the gateway")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--out", default=str(REPORTS / "engine_affinity"), help="report path without suffix")
    args = ap.parse_args(argv)
    replicas = [u.strip().rstrip("/") for u in args.replicas.split(",") if u.strip()]
    with tempfile.TemporaryDirectory(prefix="sy-affinity-") as tmp:
        results = {mode: run_gateway_mode(args, replicas, mode, Path(tmp) / mode) for mode in MODES}
    report = {
        "replicas": replicas, "prefixes": args.prefixes, "rounds": args.rounds,
        "concurrency": args.concurrency, "results": results,
    }  # fmt: skip
    save_report(Path(args.out), report, render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
