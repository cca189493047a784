"""Flat vs IVF search in one semantic-cache partition: cost and how often the IVF index changes
the nearest cached question (the evidence for ``SemanticCache(ivf_at=8_192)`` and nprobe >= 16).

    python -m load_tests.semcache_ivf [--entries 16000] [--queries 3000]

A partition is filled with distinct QQP ``text_a`` questions (../shared/data, read in place; the
command stops when it is absent) and queried with the ``text_b`` of their pairs, once through a
flat index and once through IVF at each nprobe. Reports the ms per search (p50 over queries, one
thread) and the share of queries whose top-1 differs, overall and among those whose flat top-1
cosine is >= 0.8 (the ones a verifier could accept). Writes semcache-ivf-<UTC>.json and .md."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from load_tests.bench_report import save_report

ROOT = Path(__file__).resolve().parents[1]
QQP = ROOT.parent / "shared" / "data" / "semcache" / "qqp-dev.jsonl"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=16_000)
    p.add_argument("--queries", type=int, default=3_000)
    p.add_argument("--out", type=Path, default=ROOT / "load_tests" / "reports")
    args = p.parse_args(argv)
    if not QQP.exists():
        print(f"{QQP} is not there: nothing to measure", file=sys.stderr)
        return 1
    from gateway.cache.embedder import load_embedder
    from gateway.cache.semantic_index import PartitionIndex

    rows = [json.loads(line) for line in QQP.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = sorted({r["text_a"] for r in rows})[: args.entries]
    row_of = {t: i for i, t in enumerate(texts)}
    queries = [r for r in rows if r["text_a"] in row_of][: args.queries]
    emb = load_embedder("onnx")
    vecs = np.concatenate([emb.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    qvecs = emb.encode([r["text_b"] for r in queries])
    pool = ThreadPoolExecutor(1)
    ids = np.arange(len(texts), dtype=np.int64)
    flat, ivf = PartitionIndex(10**9, pool), PartitionIndex(2_048, pool)
    flat.add(ids, vecs)
    ivf.add(ids, vecs)
    ivf.wait_upgrade()

    def timed(index: Any, q: Any) -> tuple[float, Any, Any]:
        t = time.perf_counter()
        scores, found = index.search(q, 4)
        return time.perf_counter() - t, scores, found

    base = [timed(flat, q) for q in qvecs]
    nlist = int(ivf._index.nlist)
    results: dict[str, Any] = {"flat": {"ms_p50": round(statistics.median(t for t, _, _ in base) * 1000, 3)}}
    for nprobe in (8, 16, 32):
        ivf._index.nprobe = nprobe
        runs = [timed(ivf, q) for q in qvecs]
        differ = [b[2][0] != r[2][0] for b, r in zip(base, runs, strict=True)]
        high = [d and b[1][0] >= 0.8 for b, d in zip(base, differ, strict=True)]
        results[f"ivf nprobe {nprobe}"] = {
            "ms_p50": round(statistics.median(t for t, _, _ in runs) * 1000, 3),
            "top1_differs": round(sum(differ) / len(differ), 4),
            "top1_differs_flat_cos_ge_0.8": round(sum(high) / len(high), 4),
        }
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "entries": len(texts), "queries": len(queries), "nlist": nlist, "results": results,
    }  # fmt: skip
    lines = [
        f"# Semantic-cache partition: flat vs IVF — {report['when']}",
        "",
        f"{len(texts)} cached questions, {len(queries)} queries, IVF with {nlist} lists.",
        "",
        "| index | search ms p50 | top-1 differs from flat | ... among flat cosine >= 0.8 |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        high = r.get("top1_differs_flat_cos_ge_0.8", "")
        lines.append(f"| {name} | {r['ms_p50']} | {r.get('top1_differs', '')} | {high} |")
    markdown = "\n".join(lines) + "\n"
    save_report(args.out / f"semcache-ivf-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}", report, markdown)
    print(markdown)
    pool.shutdown()
    emb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
