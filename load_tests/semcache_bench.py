"""Semantic-cache benchmark: lookup latency (embed + search + verify), throughput on one core,
and memory for 1M entries per replica. Writes JSON + Markdown to load_tests/reports/.

    python -m load_tests.semcache_bench [--entries 1000000] [--queries 500] [--seconds 10]

Three parts, each measured the way the gateway runs it (one thread for torch/onnxruntime/faiss):

1. latency: a cache of ``--warm`` real questions (QQP ``text_a`` when ../shared/data is there,
   else generated ones) in one context; each query (``text_b``) is embedded and looked up.
2. throughput: asyncio callers through ``Embedder.embed`` (micro-batching) + lookup.
3. memory: a separate process fills one cache to ``--entries`` with realistic sizes (unit
   vectors near real ones, 60-char questions, ~700-byte JSON completions) and reports RSS
   growth and lookup latency at that size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from load_tests.bench_report import save_report

ROOT = Path(__file__).resolve().parents[1]
QQP = ROOT.parent / "shared" / "data" / "semcache" / "qqp-dev.jsonl"
REPORTS = ROOT / "load_tests" / "reports"


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1000.0


def questions(n: int) -> list[tuple[str, str]]:
    if QQP.exists():
        out = []
        with QQP.open() as fh:
            for line in fh:
                row = json.loads(line)
                out.append((row["text_a"], row["text_b"]))
                if len(out) >= n:
                    break
        return out
    topics = [
        "python",
        "taxes",
        "running",
        "cooking",
        "linux",
        "history",
        "music",
        "travel",
        "chess",
        "gardens",
    ]
    return [
        (f"How do I get better at {topics[i % 10]} number {i}?", f"Tips to improve at {topics[i % 10]}?")
        for i in range(n)
    ]


def completion(text: str) -> bytes:
    body = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": ("Answer to: " + text + " ") * 8}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 120, "total_tokens": 140},
    }  # fmt: skip
    return json.dumps(body).encode()


def latency_and_throughput(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.cache.embedder import load_embedder
    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_key import semantic_key
    from gateway.cache.verifier import load_verifier

    emb = load_embedder(args.embedder)
    cache = SemanticCache(load_verifier(), max_entries=args.warm * 2)
    pairs = questions(args.warm)

    def key(text: str) -> Any:
        return semantic_key("bench", "faq", {"model": "faq", "messages": [{"role": "user", "content": text}]})

    started = time.perf_counter()
    for i in range(0, len(pairs), 256):
        chunk = pairs[i : i + 256]
        vecs = emb.encode([a for a, _ in chunk])
        for (a, _), v in zip(chunk, vecs, strict=True):
            k = key(a)
            cache.insert(k.context, k.text, v, completion(a), 3600)
    fill_s = time.perf_counter() - started
    cache.wait_idle()
    embed_t, search_t, total_t, hits = [], [], [], 0
    for _, b in pairs[: args.queries]:
        t0 = time.perf_counter()
        k = key(b)
        v = emb.encode([k.text])[0]
        t1 = time.perf_counter()
        found = cache.lookup(k.context, k.text, v)
        t2 = time.perf_counter()
        embed_t.append(t1 - t0)
        search_t.append(t2 - t1)
        total_t.append(t2 - t0)
        hits += found.hit

    async def run_clients() -> tuple[int, float]:
        texts = [b for _, b in pairs[: args.queries]]
        done = 0
        stop = time.perf_counter() + args.seconds

        async def client(offset: int) -> None:
            nonlocal done
            i = offset
            while time.perf_counter() < stop:
                k = key(texts[i % len(texts)])
                v = await emb.embed(k.text)
                cache.lookup(k.context, k.text, v)
                done += 1
                i += args.concurrency

        t = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(args.concurrency)))
        return done, time.perf_counter() - t

    done, elapsed = asyncio.run(run_clients())
    result = {
        "embedder": emb.name,
        "entries": len(cache),
        "fill_seconds": round(fill_s, 2),
        "queries": len(total_t),
        "hit_rate": round(hits / max(1, len(total_t)), 3),
        "lookup_ms": {"p50": round(pct(total_t, 50), 3), "p90": round(pct(total_t, 90), 3),
                      "p99": round(pct(total_t, 99), 3)},
        "embed_ms": {"p50": round(pct(embed_t, 50), 3), "p99": round(pct(embed_t, 99), 3)},
        "search_verify_ms": {"p50": round(pct(search_t, 50), 3), "p99": round(pct(search_t, 99), 3)},
        "throughput": {"concurrency": args.concurrency, "seconds": round(elapsed, 2),
                       "lookups_per_s": round(done / elapsed, 1), "batches": emb.batches,
                       "mean_batch": round(emb.batched_texts / max(1, emb.batches), 2)},
    }  # fmt: skip
    cache.close()
    emb.close()
    return result


def memory_child(entries: int, queries: int) -> dict[str, Any]:
    """Runs in its own process: RSS of one cache holding ``entries`` entries."""
    from gateway.cache.semantic import Entry, SemanticCache
    from gateway.cache.semantic_index import faiss_module
    from gateway.cache.verifier import load_verifier

    faiss_module()
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(2048, 384)).astype(np.float32)
    base = rss_bytes()
    cache = SemanticCache(load_verifier(), max_entries=entries)
    context = "c" * 64
    chunk = 50_000
    started = time.perf_counter()
    for lo in range(0, entries, chunk):
        n = min(chunk, entries - lo)
        vecs = centers[rng.integers(0, len(centers), n)] + rng.normal(scale=0.6, size=(n, 384)).astype(
            np.float32
        )
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        items = []
        for i in range(n):
            text = f"How do I configure feature {lo + i} of the product in region {i % 97}?"
            items.append(Entry(f"{lo + i:x}-bench", context, text, b"", time.time() + 86400))
        for item in items:
            item.payload = _packed(item.text)
        cache.add_many(items, vecs)
        if lo == 0:
            cache.wait_idle()  # the IVF upgrade at ivf_at entries
    cache.wait_idle()
    fill_s = time.perf_counter() - started
    grown = rss_bytes() - base
    part = cache.partition(context)
    # lookup at 1M: search + verify for a query near a stored vector
    lat = []
    probe = rng.integers(0, entries, queries)
    for j in probe:
        i = int(j)
        v = centers[i % len(centers)] + rng.normal(scale=0.6, size=384).astype(np.float32)
        v /= np.linalg.norm(v)
        t = time.perf_counter()
        cache.lookup(context, f"How do I configure feature {i} of the product in region {i % 97}?", v)
        lat.append(time.perf_counter() - t)
    return {
        "entries": len(cache),
        "index": part.kind if part else None,
        "rss_growth_bytes": grown,
        "rss_growth_gib": round(grown / 2**30, 3),
        "bytes_per_entry": round(grown / max(1, len(cache))),
        "fill_seconds": round(fill_s, 1),
        "search_verify_ms_at_size": {"p50": round(pct(lat, 50), 3), "p99": round(pct(lat, 99), 3)},
    }


def _packed(text: str) -> bytes:
    from gateway.cache.semantic import pack

    return pack(completion(text))


def markdown(report: dict[str, Any]) -> str:
    lat, mem = report.get("latency"), report.get("memory")
    lines = [
        "# Semantic cache benchmark",
        "",
        f"{report['when']} on {report['machine']} (one thread for onnxruntime/torch/faiss).",
        "Shared, noisy CPU unless stated otherwise: re-measure on a quiet machine.",
        "",
    ]
    if lat:
        lines += [
            f"## Lookup (embed + search + verify), {lat['entries']} cached questions,"
            f" embedder {lat['embedder']}",
            "",
            "| metric | p50 ms | p99 ms |",
            "| --- | --- | --- |",
            f"| lookup total | {lat['lookup_ms']['p50']} | {lat['lookup_ms']['p99']} |",
            f"| embed | {lat['embed_ms']['p50']} | {lat['embed_ms']['p99']} |",
            f"| search + verify | {lat['search_verify_ms']['p50']} | {lat['search_verify_ms']['p99']} |",
            "",
            "Throughput through `Embedder.embed` (micro-batching) + lookup,"
            f" {lat['throughput']['concurrency']} concurrent callers:"
            f" **{lat['throughput']['lookups_per_s']} lookups/s**"
            f" (mean batch {lat['throughput']['mean_batch']}).",
            "",
        ]
    if mem:
        lines += [
            f"## Memory: {mem['entries']:,} entries in one replica ({mem['index']} index)",
            "",
            f"RSS growth **{mem['rss_growth_gib']} GiB** ({mem['bytes_per_entry']} bytes an entry:"
            " fp16 vector, question, compressed ~700-byte completion, bookkeeping); filled in "
            f"{mem['fill_seconds']} s. Search + verify at that size: p50 "
            f"{mem['search_verify_ms_at_size']['p50']} ms, p99 {mem['search_verify_ms_at_size']['p99']} ms.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--entries", type=int, default=1_000_000, help="entries for the memory part (0: skip)"
    )
    parser.add_argument("--warm", type=int, default=5000, help="cached questions for the latency part")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput run length")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--embedder", default="auto", choices=["auto", "onnx", "torch"])
    parser.add_argument("--out", default=str(REPORTS / "semcache"), help="report path without extension")
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.queries)))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "latency": latency_and_throughput(args),
    }
    if args.entries:
        cmd = [sys.executable, "-m", "load_tests.semcache_bench", "--memory-child", str(args.entries)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        report["memory"] = json.loads(out.stdout.strip().splitlines()[-1])
    save_report(Path(args.out), report, markdown(report))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
