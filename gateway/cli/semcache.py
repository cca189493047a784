"""`switchyard eval semcache` and `switchyard train semcache`: the semantic cache's tools.

    switchyard eval semcache --pairs FILE.jsonl [--split heldout] [--json] [--plot out.png]
    switchyard eval semcache --pairs FILE.jsonl --stream [--min-component 3] [--json]
    switchyard train semcache --pairs FILE.jsonl [--out gateway/cache/verifier_weights.npz]

The evaluation (``gateway.lab.semcache_eval``) replays every pair through the real cache code;
the training is ``gateway.lab.verifier_train``. numpy, faiss and the embedder are imported when
a command runs, never at CLI start-up."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.cache.embedder import load_embedder
    from gateway.cache.verifier import analyse, load_verifier
    from gateway.lab.semcache_eval import THRESHOLDS, plot_precision_recall, rates, replay
    from gateway.lab.verifier_train import read_pairs

    pairs = read_pairs(Path(args.pairs), args.split)
    if args.limit:
        pairs = pairs[: args.limit]
    if not pairs:
        print(f"no pairs in {args.pairs} (split {args.split})", file=sys.stderr)
        return 1
    verifier = load_verifier(Path(args.weights) if args.weights else None)
    if args.stream:
        return _stream(args, pairs, load_embedder(args.embedder), verifier)
    results = replay(pairs, load_embedder(args.embedder), verifier)
    labels = [y for _, _, y in pairs]
    default = rates([hit for _, _, hit in results], labels)
    if args.json:
        print(json.dumps({k: default[k] for k in ("hit_rate", "precision", "recall", "n")}))
    curve = [{"threshold": t, **rates([s >= t and s > 0 for s, _, _ in results], labels)} for t in THRESHOLDS]
    cos_t = [0.75, 0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]
    cosine_curve = [{"threshold": t, **rates([c >= t for _, c, _ in results], labels)} for t in cos_t]
    if not args.json:
        print(
            f"pairs {default['n']} ({args.split}), positives {sum(labels)},"
            f" verifier threshold {verifier.threshold}"
        )
        print(
            f"default: hit rate {default['hit_rate']:.3f}  precision {default['precision']:.3f}"
            f"  recall {default['recall']:.3f}"
        )
        same = [y for a, b, y in pairs if analyse(a).words == analyse(b).words]
        if same:  # the labels' own ceiling: these are hits at any setting
            print(
                f"label check: {len(same)} pairs have identical words (case, spacing, punctuation"
                f" aside); {1 - sum(same) / len(same):.1%} of them are labelled 'not the same'"
            )
        print("\nverifier score >= t            cosine only >= t")
        print(" t     hit    prec   recall     t     hit    prec   recall")
        for i in range(max(len(curve), len(cosine_curve))):
            left = right = ""
            if i < len(curve):
                c = curve[i]
                left = f"{c['threshold']:.2f}  {c['hit_rate']:.3f}  {c['precision']:.3f}  {c['recall']:.3f}"
            if i < len(cosine_curve):
                c = cosine_curve[i]
                right = f"{c['threshold']:.2f}  {c['hit_rate']:.3f}  {c['precision']:.3f}  {c['recall']:.3f}"
            print(f"{left:<31}{right}")
    if args.plot:
        plot_precision_recall(Path(args.plot), curve, cosine_curve, default)
        if not args.json:
            print(f"\nplot: {args.plot}")
    return 0


def _stream(args: argparse.Namespace, pairs: list[tuple[str, str, int]], embedder: Any, verifier: Any) -> int:
    from gateway.lab.semcache_stream import embed_texts, stream_table

    rows = stream_table(
        pairs, embed_texts(embedder, pairs), verifier, min_component=args.min_component, seed=args.seed
    )
    if args.json:
        print(json.dumps(rows))
        return 0
    first = rows[0]
    print(
        f"streams of {args.pairs} ({args.split}): components of >= {args.min_component} texts,"
        f" {first['queries']} queries, {first['answerable']} answerable; verifier threshold"
        f" {verifier.threshold}"
    )
    print(
        "\n| mode | judge recall | precision | recall | hits | wrong | unknown"
        " | band hits (precision) | feedback |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        jr = "-" if r["judge_recall"] is None else f"{r['judge_recall']:.1f}"
        band = f"{r['band_hits']} ({r['band_precision']})" if r["band_hits"] else "0"
        print(
            f"| {r['mode']} | {jr} | {r['precision']:.3f} | {r['recall']:.3f} | {r['hits']} |"
            f" {r['wrong']} | {r['unknown']} | {band} | {r['feedback']} |"
        )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from gateway.cache.embedder import load_embedder
    from gateway.cache.verifier import WEIGHTS_PATH
    from gateway.lab.verifier_train import train

    embedder = load_embedder(args.embedder)
    verifier, meta = train(Path(args.pairs), embedder, target_precision=args.target_precision)
    out = Path(args.out) if args.out else WEIGHTS_PATH
    verifier.save(out)
    print(
        f"wrote {out}: threshold {verifier.threshold}, {meta['candidates']} training candidates,"
        f" out-of-fold precision {meta['oof_precision']} recall {meta['oof_recall']}"
    )
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", required=True, help="JSONL rows with text_a, text_b, label (1 = same question)")
    p.add_argument("--embedder", default="auto", choices=["auto", "onnx", "torch"], help="embedding backend")


def register_eval(esub: Any) -> None:
    """`eval semcache` on the `eval` subcommand group."""
    ev = esub.add_parser(
        "semcache", help="hit rate, precision, recall of the semantic cache on labelled pairs"
    )
    _common(ev)
    ev.add_argument(
        "--split",
        default="all",
        choices=["all", "heldout", "train"],
        help="held-out = never seen in training",
    )
    ev.add_argument("--json", action="store_true", help="one JSON object at the default setting")
    ev.add_argument("--plot", help="write the precision-recall curve as PNG")
    ev.add_argument("--weights", help="verifier weights .npz (default: the shipped one)")
    ev.add_argument("--limit", type=int, default=0, help="use the first N pairs only")
    ev.add_argument(
        "--stream",
        action="store_true",
        help="streams over the pair graph with feedback: static vs per-entry online thresholds"
        " (gateway.lab.semcache_stream)",
    )
    ev.add_argument("--min-component", type=int, default=3, help="--stream: smallest stream (texts)")
    ev.add_argument("--seed", type=int, default=0, help="--stream: the streams' order and the judge's draws")
    ev.set_defaults(func=cmd_eval)


def register_train(sub: Any) -> None:
    """`train semcache` on the `train` subcommand group (created by `train router`, else here)."""
    train = sub.choices.get("train") or sub.add_parser("train", help="train models from labelled data")
    groups = [a for a in train._actions if isinstance(a, argparse._SubParsersAction)]
    tsub = groups[0] if groups else train.add_subparsers(dest="train_command")
    tr = tsub.add_parser("semcache", help="train the semantic-cache verifier on labelled question pairs")
    _common(tr)
    tr.add_argument("--out", help="weights .npz to write (default: the packaged verifier_weights.npz)")
    tr.add_argument(
        "--target-precision", type=float, default=0.95, help="out-of-fold precision the threshold aims at"
    )
    tr.set_defaults(func=cmd_train)
