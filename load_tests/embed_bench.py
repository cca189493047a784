"""Per-text cost of the shared MiniLM embedder by batch size, and what batching does to vectors.

    python -m load_tests.embed_bench [--n 128] [--fp32] [--threads 1 2] [--out DIR]

Texts: ``short`` = the auto-path load test's prompts (~26 tokens); ``mmlu`` = prompts from
../shared/data/routing/mmlu.jsonl (~75 tokens, up to the 256-token window), when present.
Each batch size runs over the texts sorted by token length (length bucketing: little padding),
padded to the longest in its batch. Reports wall and process-CPU milliseconds per text, and the
smallest cosine between a text's vector in a batch and the same text encoded alone (int8
dynamic quantisation scales activations per batch). ``--fp32`` also exports and measures the
fused float32 model. Writes embed-bench-<UTC>.json and .md under DIR (default load_tests/reports)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from load_tests.auto_path import DEFAULT_OUT, prompt
from load_tests.bench_procs import ROOT, machine_info
from load_tests.bench_report import save_report

MMLU = ROOT.parent / "shared" / "data" / "routing" / "mmlu.jsonl"
BATCHES = (1, 4, 16, 64)


def texts_by_set(n: int) -> dict[str, list[str]]:
    sets = {"short": [prompt(i, 7) for i in range(n)]}
    if MMLU.exists():
        rows = [json.loads(line)["prompt"] for line in MMLU.open(encoding="utf-8") if line.strip()][:2000]
        random.Random(0).shuffle(rows)
        sets["mmlu"] = rows[:n]
    else:
        print(f"{MMLU} absent: MMLU-length texts skipped", file=sys.stderr)
    return sets


def session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    from gateway.cache.embed_backends import DISABLED_OPTIMIZERS

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(  # the session the gateway serves with
        str(path),
        sess_options=opts,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(DISABLED_OPTIMIZERS),
    )


def run_batches(sess: Any, encs: list[Any], batch: int) -> tuple[float, float, Any]:
    """(wall ms per text, CPU ms per text, (n, 384) vectors in ``encs`` order)."""
    import numpy as np

    out = np.zeros((len(encs), 384), dtype=np.float32)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(encs), batch):
        chunk = encs[start : start + batch]
        width = max(len(e.ids) for e in chunk)
        ids = np.zeros((len(chunk), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for j, e in enumerate(chunk):
            ids[j, : len(e.ids)] = e.ids
            mask[j, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = sess.run(None, feeds)[0]
        pooled = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        out[start : start + len(chunk)] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    n = len(encs)
    return (time.perf_counter() - t0) * 1000 / n, (time.process_time() - c0) * 1000 / n, out


def measure(models: dict[str, Path], sets: dict[str, list[str]], threads: list[int]) -> list[dict[str, Any]]:
    import tokenizers

    from gateway.cache import embed_backends

    tok = tokenizers.Tokenizer.from_file(str(embed_backends._model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=embed_backends.MAX_TOKENS)
    tok.no_padding()
    rows: list[dict[str, Any]] = []
    for model, path in models.items():
        for nthreads in threads:
            sess = session(path, nthreads)
            for name, texts in sets.items():
                encs = sorted(tok.encode_batch(texts), key=lambda e: len(e.ids))
                tokens = sum(len(e.ids) for e in encs) / len(encs)
                run_batches(sess, encs[:8], 1)  # warm-up
                alone = None
                for batch in BATCHES:
                    wall, cpu, vecs = run_batches(sess, encs, batch)
                    if alone is None:
                        alone = vecs
                    row = {
                        "model": model, "threads": nthreads, "texts": name, "mean_tokens": round(tokens, 1),
                        "batch": batch, "wall_ms_per_text": round(wall, 3), "cpu_ms_per_text": round(cpu, 3),
                        "min_cos_vs_alone": round(float((vecs * alone).sum(axis=1).min()), 5),
                    }  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Embedder per-text cost by batch size ({report['started']})",
        "",
        f"Machine: {report['machine']}. {report['n']} texts per set, sorted by token length, "
        "padded within each batch. CPU = process CPU time (all ORT threads).",
        "",
        "| model | threads | texts (mean tokens) | batch | wall ms/text | CPU ms/text | texts/s "
        "| min cos vs alone |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['model']} | {r['threads']} | {r['texts']} ({r['mean_tokens']}) | {r['batch']} | "
            f"{r['wall_ms_per_text']:.2f} | {r['cpu_ms_per_text']:.2f} | "
            f"{1000 / r['wall_ms_per_text']:.0f} | "
            f"{r['min_cos_vs_alone']:.5f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.embed_bench", description=__doc__)
    p.add_argument("--n", type=int, default=128, help="texts per set")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="ORT intra-op threads")
    p.add_argument("--fp32", action="store_true", help="also export and measure the float32 model")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    from gateway.cache import embed_backends
    from gateway.config.settings import default_home

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="sy-embed-bench-") as tmp:
        models = {"int8": embed_backends.onnx_path(default_home())}
        if args.fp32:
            models["fp32"] = Path(tmp) / "fp32.onnx"
            embed_backends.export_onnx(Path(tmp) / "int8.onnx", keep_fp32=models["fp32"])
        elif not models["int8"].exists():
            embed_backends.export_onnx(models["int8"])
        rows = measure(models, texts_by_set(args.n), args.threads)
    report = {"started": started, "machine": machine_info(), "n": args.n, "rows": rows}
    stem = args.out / f"embed-bench-{started.replace(':', '')}"
    save_report(stem, report, markdown(report))
    print(markdown(report))
    print(f"wrote {stem}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
