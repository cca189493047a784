"""Does a cross-encoder verifier beat the shipped one? Trains it and compares on held-out QQP.

    python -m load_tests.pair_verifier_eval [--layers 6] [--epochs 1] [--limit N] [--weights W.npz]

Data: ../shared/data/semcache/qqp-dev.jsonl (read in place; the command stops when it is
absent), split as ``switchyard train semcache`` splits it: held-out pairs
(``verifier_train.is_heldout``) are only scored; of the training split, validation fold 0 is
left out and the rest is fitted (``load_tests.pair_verifier.fit``; one pass over 25,818 pairs
takes ~22 min on one core). ``--weights`` scores saved adapters instead of fitting.

On the held-out pairs it reports, for the shipped verifier's model (MLP on the MiniLM vectors
and lexical features, ``Verifier.probabilities``), the int8 cross-encoder and the sum of their
logits: ROC AUC, precision at recall 0.35 (the issue's target point), the highest recall with
precision >= 0.95, and the cross-encoder's CPU per pair. Writes pair-verifier-<UTC>.json and
.md under --out (default load_tests/reports); the fitted adapters go to --save."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from load_tests.bench_report import save_report

ROOT = Path(__file__).resolve().parents[1]
QQP = ROOT.parent / "shared" / "data" / "semcache" / "qqp-dev.jsonl"
DEFAULT_OUT = ROOT / "load_tests" / "reports"
F64 = npt.NDArray[np.float64]


def auc(scores: F64, labels: F64) -> float:
    """ROC AUC by ranks (ties averaged)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average the ranks of ties
        tied = scores == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / max(1, n_pos * n_neg))


def operating_points(scores: F64, labels: F64) -> dict[str, float]:
    order = np.argsort(-scores, kind="stable")
    y = labels[order]
    precision = np.cumsum(y) / np.arange(1, len(y) + 1)
    recall = np.cumsum(y) / max(1.0, y.sum())
    at = int(np.searchsorted(recall, 0.35))
    good = np.nonzero(precision >= 0.95)[0]
    good = good[good >= min(49, len(y) - 1)]  # from 50 hits on, as the threshold pick does
    return {
        "auc": round(auc(scores, labels), 4),
        "precision_at_recall_0.35": round(float(precision[min(at, len(y) - 1)]), 4),
        "max_recall_at_precision_0.95": round(float(recall[good.max()]) if len(good) else 0.0, 4),
    }


def logit(p: F64) -> F64:
    q = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(q / (1 - q)), dtype=np.float64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6, help="transformer layers kept (1-6)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads while fitting")
    p.add_argument("--limit", type=int, default=0, help="fit on the first N pairs only (a quick check)")
    p.add_argument("--weights", type=Path, default=None, help="score these adapters instead of fitting")
    p.add_argument("--save", type=Path, default=Path("/tmp/pair-verifier/pair_weights.npz"))
    p.add_argument("--home", type=Path, default=Path("/tmp/pair-verifier/home"), help="ONNX exports")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if not QQP.exists():
        print(f"{QQP} is not there: nothing to evaluate", file=sys.stderr)
        return 1
    from gateway.cache.embedder import load_embedder
    from gateway.cache.verifier import analyse, load_verifier, model_input
    from gateway.lab.verifier_train import pair_vectors, read_pairs, val_fold
    from load_tests.pair_verifier import PairEncoder, fit, load_pair_weights

    started = time.time()
    if args.weights:
        weights = load_pair_weights(args.weights)
    else:
        train = [r for r in read_pairs(QQP, "train") if val_fold(r[0], r[1]) != 0]
        train = train[: args.limit] if args.limit else train
        log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        weights = fit(
            train, rank=args.rank, epochs=args.epochs, threads=args.threads, layers=args.layers, log=log
        )
        args.save.parent.mkdir(parents=True, exist_ok=True)
        weights.save(args.save)
    encoder = PairEncoder(weights, args.home)
    held = read_pairs(QQP, "heldout")
    labels = np.asarray([float(y) for *_, y in held])
    cpu: list[float] = []
    ce = np.empty(len(held))
    for i, (a, b, _) in enumerate(held):
        t = time.process_time()
        ce[i] = encoder.probability(a, b)
        cpu.append(time.process_time() - t)
    embedder = load_embedder("onnx")
    va, vb = pair_vectors(embedder, held)
    rows = [
        model_input(analyse(a), analyse(b), float(u @ v), u, v)
        for (a, b, _), u, v in zip(held, va, vb, strict=True)
    ]
    mlp = load_verifier().probabilities(np.asarray(rows, dtype=np.float32))
    results = {
        "shipped MLP verifier": operating_points(mlp, labels),
        f"cross-encoder ({weights.layers} layers)": operating_points(ce, labels),
        "MLP + cross-encoder (logit sum)": operating_points(logit(mlp) + logit(ce), labels),
    }
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "heldout_pairs": len(held),
        "model": weights.meta,
        "cross_encoder_cpu_ms_per_pair_p50": round(statistics.median(cpu) * 1000, 3),
        "results": results,
        "seconds": round(time.time() - started, 1),
    }
    lines = [
        f"# Cross-encoder verifier vs the shipped one — {report['when']}",
        "",
        f"Held-out QQP pairs: {len(held)}. Cross-encoder: {weights.meta.get('model', '')}; "
        f"fitted on {weights.meta.get('fit_pairs', '?')} pairs; int8 ONNX, "
        f"{report['cross_encoder_cpu_ms_per_pair_p50']} ms CPU per pair (p50).",
        "",
        "| verifier | ROC AUC | precision at recall 0.35 | max recall at precision >= 0.95 |",
        "| --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['auc']} | {r['precision_at_recall_0.35']} | {r['max_recall_at_precision_0.95']} |"
        )
    markdown = "\n".join(lines) + "\n"
    save_report(
        args.out / f"pair-verifier-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}", report, markdown
    )
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
