"""`switchyard eval semcache` and `switchyard train semcache`: the semantic cache's tools.

    switchyard eval semcache --pairs FILE.jsonl [--split heldout] [--json] [--plot out.png]
    switchyard train semcache --pairs FILE.jsonl [--out gateway/cache/verifier_weights.npz]

The evaluation replays every pair through the real cache code: ``text_a`` is stored as the
answer to a one-message chat, ``text_b`` is looked up in the same context (each pair in its
own context, so pairs never meet), and the lookup's verifier score decides the hit. numpy,
faiss and the embedder are imported when a command runs, never at CLI start-up."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

THRESHOLDS = [round(0.05 * i, 2) for i in range(1, 20)]


def _rates(hits: list[bool], labels: list[int]) -> dict[str, Any]:
    n = len(labels)
    tp = sum(1 for h, y in zip(hits, labels, strict=True) if h and y == 1)
    nh = sum(hits)
    pos = sum(labels)
    return {
        "hit_rate": nh / n if n else 0.0,
        "precision": tp / nh if nh else 1.0,
        "recall": tp / pos if pos else 0.0,
        "hits": nh,
        "n": n,
    }


def replay(
    pairs: list[tuple[str, str, int]], embedder: Any, verifier: Any
) -> list[tuple[float, float, bool]]:
    """(verifier score, cosine, hit at the default threshold) per pair, through SemanticCache."""
    import numpy as np

    from gateway.cache.semantic import SemanticCache
    from gateway.cache.semantic_key import semantic_key

    cache = SemanticCache(verifier, max_entries=max(1, len(pairs)))
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    vecs = np.concatenate([embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    row = {t: i for i, t in enumerate(texts)}
    out = []
    try:
        for i, (a, b, _) in enumerate(pairs):
            key_a = semantic_key(
                f"eval-{i}", "eval", {"model": "eval", "messages": [{"role": "user", "content": a}]}
            )
            key_b = semantic_key(
                f"eval-{i}", "eval", {"model": "eval", "messages": [{"role": "user", "content": b}]}
            )
            assert key_a is not None and key_b is not None and key_a.context == key_b.context
            cache.insert(key_a.context, key_a.text, vecs[row[a]], b'{"pair": %d}' % i, ttl=3600.0)
            found = cache.lookup(key_b.context, key_b.text, vecs[row[b]])
            out.append((found.score, found.cosine, found.hit))
    finally:
        cache.close()
    return out


def _plot(
    path: Path, curve: list[dict[str, Any]], cosine_curve: list[dict[str, Any]], default: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot([c["recall"] for c in curve], [c["precision"] for c in curve], "o-", label="verifier score")
    ax.plot(
        [c["recall"] for c in cosine_curve],
        [c["precision"] for c in cosine_curve],
        "s--",
        label="cosine only",
    )
    ax.plot([default["recall"]], [default["precision"]], "r*", markersize=14, label="default setting")
    ax.axhline(0.95, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("recall (true repeats answered from cache)")
    ax.set_ylabel("precision (hits that were right)")
    ax.set_title("Semantic cache: precision-recall over thresholds")
    ax.set_xlim(0, 1)
    ax.set_ylim(0.4, 1.01)
    ax.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.cache.embedder import load_embedder
    from gateway.cache.verifier import analyse, load_verifier
    from gateway.lab.verifier_train import read_pairs

    pairs = read_pairs(Path(args.pairs), args.split)
    if args.limit:
        pairs = pairs[: args.limit]
    if not pairs:
        print(f"no pairs in {args.pairs} (split {args.split})", file=sys.stderr)
        return 1
    verifier = load_verifier(Path(args.weights) if args.weights else None)
    results = replay(pairs, load_embedder(args.embedder), verifier)
    labels = [y for _, _, y in pairs]
    default = _rates([hit for _, _, hit in results], labels)
    if args.json:
        print(json.dumps({k: default[k] for k in ("hit_rate", "precision", "recall", "n")}))
    curve = [
        {"threshold": t, **_rates([s >= t and s > 0 for s, _, _ in results], labels)} for t in THRESHOLDS
    ]
    cos_t = [0.75, 0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99]
    cosine_curve = [{"threshold": t, **_rates([c >= t for _, c, _ in results], labels)} for t in cos_t]
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
        _plot(Path(args.plot), curve, cosine_curve, default)
        if not args.json:
            print(f"\nplot: {args.plot}")
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
