"""`switchyard train router | router score | eval router`: the complexity classifier's tools.

    switchyard train router --data DIR_OR_FILES... [--out PATH]
    switchyard train router --data DIR_OR_FILES... --cross-task [--json]
    switchyard router score --input prompts.jsonl --output scores.jsonl
    switchyard eval router --data FILE.jsonl [--json] [--plot out.png]

Everything heavy (numpy, the embedder, matplotlib) is imported when a command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.cache.embedder import Embedder


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def read_jsonl(path: Path, need: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or any(k not in row for k in need):
                raise ValueError(f"{path}:{i}: a row needs the fields {', '.join(need)}")
            if not isinstance(row["prompt"], str):
                raise ValueError(f"{path}:{i}: 'prompt' must be a string")
            rows.append(row)
    return rows


def _workers(arg: int | None) -> int:
    """Embedding threads: as asked, else one per CPU this process may use (at most 8)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, arg if arg else min(8, usable or 1))


# ----------------------------------------------------------------------------- router score
def cmd_score(args: argparse.Namespace) -> int:
    from gateway.lab.batch_embed import encode_all, load_embedders
    from gateway.routing.classifier import ClassifierError, ComplexityClassifier
    from gateway.routing.prompt_difficulty import PromptDifficulty

    try:
        rows = read_jsonl(Path(args.input), ("prompt",))
        weights = Path(args.weights) if args.weights else None
        clf: ComplexityClassifier | PromptDifficulty = (
            PromptDifficulty.load(weights)
            if args.scorer == "difficulty"
            else ComplexityClassifier.load(weights)
        )
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    t0 = time.perf_counter()
    embedders = load_embedders(_workers(args.workers), args.embedder)
    try:
        clf.check_embedder(embedders[0].name, embedders[0].dim)
    except ClassifierError as exc:
        return _fail(str(exc))
    t1 = time.perf_counter()
    texts = [r["prompt"] for r in rows]
    vecs = encode_all(texts, embedders) if texts else None
    scores: list[float] = []
    if vecs is not None:
        batch = clf.scores(vecs, texts) if isinstance(clf, PromptDifficulty) else clf.score_batch(vecs, texts)
        scores = batch.tolist()
    success: list[dict[str, float]] = [{} for _ in scores]
    if args.models and vecs is not None:
        from gateway.cli.router_irt import model_success

        try:
            success = model_success([m for m in args.models.split(",") if m], args.difficulty, vecs, texts)
        except (ClassifierError, ValueError) as exc:
            return _fail(str(exc))
    t2 = time.perf_counter()
    with Path(args.output).open("w", encoding="utf-8") as fh:
        for s, per_model in zip(scores, success, strict=True):
            row: dict[str, Any] = {"score": round(s, 6)}
            if args.models:
                row["success"] = per_model
            fh.write(json.dumps(row) + "\n")
    rate = len(texts) / (t2 - t1) if t2 > t1 else float("inf")
    print(
        f"scored {len(texts)} prompts in {t2 - t1:.2f}s ({rate:.0f} prompts/s; embedder "
        f"{embedders[0].name} x{len(embedders)}, loaded in {t1 - t0:.2f}s) -> {args.output}",
        file=sys.stderr,
    )
    return 0


# ----------------------------------------------------------------------------- train router
def _data_files(specs: list[str]) -> list[Path]:
    files: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            files += sorted(p.glob("*.jsonl"))
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"{spec}: no such file or directory")
    if not files:
        raise ValueError("no .jsonl files in --data")
    return files


def cmd_train(args: argparse.Namespace) -> int:
    from gateway.cli.router_irt import fit_and_write
    from gateway.lab.batch_embed import cached_encode, load_embedders
    from gateway.lab.router_train import train_router

    try:
        files = _data_files(args.data)
    except ValueError as exc:
        return _fail(str(exc))
    embedders = load_embedders(_workers(args.workers), args.embedder)
    if args.irt or args.prompt_difficulty:
        from gateway.cli import router_irt

        if args.prompt_difficulty:
            return router_irt.train_prompt(args, files, embedders)
        return router_irt.train(args, files, embedders)
    if args.cross_task:
        return _cross_task(args, files, embedders)
    command = "switchyard train router " + " ".join(
        [*(f"--data {d}" for d in args.data), f"--out {args.out}"]
        + ([f"--seed {args.seed}"] if args.seed else [])
        + ([f"--embedder {args.embedder}"] if args.embedder != "auto" else [])
        + ([f"--l2 {args.l2:g}"] if args.l2 is not None else [])
        + ([f"--alpha {args.alpha:g}"] if args.alpha is not None else [])
        + ([f"--length-prior {args.length_prior:g}"] if args.length_prior is not None else [])
    )
    extra = {k: v for k, v in (("alpha", args.alpha), ("length_prior", args.length_prior)) if v is not None}
    return fit_and_write(
        args.out,
        lambda: train_router(
            files,
            lambda texts: cached_encode(texts, embedders, Path(args.cache) if args.cache else None),
            embedder_name=embedders[0].name,
            seed=args.seed,
            l2=args.l2,
            command=command,
            log=lambda m: print(m, file=sys.stderr),
            **extra,
        ),
    )


def _cross_task(args: argparse.Namespace, files: list[Path], embedders: list[Embedder]) -> int:
    """Score each task / group of domains with a router fitted without it (writes no weights)."""
    from dataclasses import asdict

    from gateway.lab.batch_embed import cached_encode
    from gateway.lab.router_crosstask import cross_task, table
    from gateway.lab.router_fit import correctness, feature_table
    from gateway.lab.router_train import ALPHA, LENGTH_PRIOR, read_examples
    from gateway.routing.classifier import SHIPPED_WEIGHTS

    try:
        examples = read_examples(files)
    except ValueError as exc:
        return _fail(str(exc))
    shipped = json.loads(SHIPPED_WEIGHTS.read_text(encoding="utf-8"))["training"]
    l2 = args.l2 if args.l2 is not None else float(shipped["l2"])
    alpha = args.alpha if args.alpha is not None else ALPHA
    prior = args.length_prior if args.length_prior is not None else LENGTH_PRIOR
    print(f"{len(examples)} labelled prompts from {len(files)} file(s); embedding ...", file=sys.stderr)
    texts = [e.prompt for e in examples]
    emb = cached_encode(texts, embedders, Path(args.cache) if args.cache else None)
    weak, strong = correctness(examples)
    results = cross_task(
        emb, feature_table(examples), weak, strong, [e.group for e in examples],
        l2=l2, alpha=alpha, length_prior=prior, seed=args.seed,
    )  # fmt: skip
    if args.json:
        splits = [asdict(r) for r in results]
        print(json.dumps({"l2": l2, "alpha": alpha, "length_prior": prior, "splits": splits}))
    else:
        print(f"recipe: l2 {l2:g}, alpha {alpha:g}, length prior {prior:g}; embedder {embedders[0].name}")
        print(table(results))
        print("random routing scores APGR ~0.5; the issue's target: APGR >= 0.70, CPT(50%) <= 30%")
    return 0


# ----------------------------------------------------------------------------- eval router
def cmd_eval(args: argparse.Namespace) -> int:
    import numpy as np

    if args.multi:
        from gateway.cli import router_irt
        from gateway.lab.batch_embed import load_embedders as _load

        try:
            router_irt.check_families(args.families)  # the arguments first: no data needed
            files = _data_files(args.multi)
        except ValueError as exc:
            return _fail(str(exc))
        return router_irt.evaluate_multi(args, files, _load(_workers(args.workers), args.embedder))
    if not args.data:
        return _fail("give --data FILE (one weak/strong file) or --multi DIR_OR_FILES...")

    from gateway.lab.batch_embed import encode_all, load_embedders
    from gateway.lab.router_eval import DEFAULT_OUTPUT_TOKENS, EvalData, evaluate, render_text
    from gateway.ledger.tokens import count_text
    from gateway.routing.classifier import ClassifierError, ComplexityClassifier

    try:
        rows = read_jsonl(Path(args.data), ("prompt", "weak_correct", "strong_correct"))
        prices = _prices(args)
    except (OSError, ValueError) as exc:
        return _fail(str(exc))
    if len(rows) < 2:
        return _fail("need at least 2 labelled rows")
    texts = [r["prompt"] for r in rows]
    if args.scores:
        try:
            scores = np.array([float(r["score"]) for r in _read_scores(Path(args.scores), len(rows))])
        except (OSError, ValueError) as exc:
            return _fail(str(exc))
    else:
        try:
            clf = ComplexityClassifier.load(Path(args.weights) if args.weights else None)
            embedders = load_embedders(_workers(args.workers), args.embedder)
            clf.check_embedder(embedders[0].name, embedders[0].dim)
        except ClassifierError as exc:
            return _fail(str(exc))
        scores = clf.score_batch(encode_all(texts, embedders), texts)
    has_resp = all(
        isinstance(r.get("weak_response"), str) and isinstance(r.get("strong_response"), str) for r in rows
    )

    def toks(key: str) -> Any:
        if has_resp:
            return np.array([count_text(r[key], "gpt-4") for r in rows], dtype=np.float64)
        return np.full(len(rows), float(DEFAULT_OUTPUT_TOKENS))

    data = EvalData(
        weak=np.array([1.0 if r["weak_correct"] else 0.0 for r in rows]),
        strong=np.array([1.0 if r["strong_correct"] else 0.0 for r in rows]),
        input_tokens=np.array([count_text(t, "gpt-4") for t in texts], dtype=np.float64),
        weak_output_tokens=toks("weak_response"),
        strong_output_tokens=toks("strong_response"),
        output_tokens_source=(
            "counted from weak_response/strong_response (cl100k_base)"
            if has_resp
            else f"estimated: {DEFAULT_OUTPUT_TOKENS} tokens per answer (the file has no responses)"
        ),
        prompt_chars=np.array([float(len(t)) for t in texts]),
    )
    report = evaluate(scores, data, prices)
    curves = report.pop("_curves")
    if args.plot:
        from gateway.lab.router_plot import plot_cost_quality

        plot_cost_quality(curves, report, Path(args.plot))
    if args.json:
        for r in report["routers"]:
            r.pop("curve", None)
        print(json.dumps(report))
    else:
        print(render_text(report))
        if args.plot:
            print(f"\ncost-quality curve: {args.plot}")
    return 0


def _read_scores(path: Path, n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    if len(rows) != n:
        raise ValueError(f"{path}: {len(rows)} scores for {n} labelled rows")
    return rows


def _prices(args: argparse.Namespace) -> Any:
    from gateway.lab.router_eval import PriceTable

    def pair(spec: str | None, default: tuple[float, float]) -> tuple[float, float]:
        if not spec:
            return default
        parts = spec.split(",")
        if len(parts) != 2:
            raise ValueError(f"price {spec!r}: expected INPUT,OUTPUT in USD per 1M tokens")
        return float(parts[0]), float(parts[1])

    base = PriceTable()
    wi, wo = pair(args.price_weak, (base.weak_input, base.weak_output))
    si, so = pair(args.price_strong, (base.strong_input, base.strong_output))
    return PriceTable(weak_input=wi, weak_output=wo, strong_input=si, strong_output=so)


# ----------------------------------------------------------------------------- parser
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--embedder", default="auto", choices=["auto", "onnx", "torch"], help="embedding backend")
    p.add_argument("--workers", type=int, default=None, help="embedding threads (default: cores, at most 8)")


def register(sub: Any) -> None:
    """`switchyard train router` and `switchyard router score`."""
    train = sub.add_parser("train", help="train models from labelled data")
    tsub = train.add_subparsers(dest="train_command", metavar="{router,semcache}")
    tr = tsub.add_parser(
        "router", help="train the complexity classifier (weak/strong correctness per prompt)"
    )
    tr.add_argument("--data", nargs="+", required=True, help="JSONL files or directories of them")
    tr.add_argument("--out", default="router_weights.json", help="weights file to write")
    tr.add_argument("--seed", type=int, default=0, help="seed of the cross-validation folds")
    tr.add_argument("--l2", type=float, default=None, help="L2 strength (default: chosen by grouped CV)")
    tr.add_argument("--cache", default=None, help="directory to cache embeddings in (never inside the repo)")
    tr.add_argument("--alpha", type=float, default=None, help="weight of P(strong correct) (default 0.75)")
    tr.add_argument("--length-prior", type=float, default=None, help="prompt-length prior (default 0.5)")
    tr.add_argument(
        "--cross-task", action="store_true",
        help="write no weights: score each file and held-out domain groups with routers fitted without them",
    )  # fmt: skip
    tr.add_argument("--json", action="store_true", help="with --cross-task: one JSON object")
    tr.add_argument(
        "--irt", action="store_true",
        help="train the difficulty model (IRT over every model in the files) and write its weights",
    )  # fmt: skip
    tr.add_argument(
        "--prompt-difficulty", action="store_true",
        help="train the pair-agnostic score of `router score --scorer difficulty` and write its weights",
    )  # fmt: skip
    _common(tr)
    tr.set_defaults(func=cmd_train)
    train.set_defaults(func=lambda _a: (train.print_help(), 2)[1])

    router = sub.add_parser("router", help="complexity classifier tools")
    rsub = router.add_subparsers(dest="router_command", metavar="{score}")
    sc = rsub.add_parser("score", help='score prompts: one {"score": float} per input row, in order')
    sc.add_argument("--input", required=True, help='JSONL with a "prompt" per row')
    sc.add_argument("--output", required=True, help="JSONL to write")
    sc.add_argument(
        "--scorer", default="classifier", choices=["classifier", "difficulty"],
        help="classifier: v1's tiered classifier (default); difficulty: the cross-task difficulty score",
    )  # fmt: skip
    sc.add_argument("--weights", default=None, help="the scorer's weights (default: the shipped ones)")
    sc.add_argument(
        "--models", default=None,
        help='also write per-model predicted success ("success": {model: p}) from the difficulty model',
    )  # fmt: skip
    sc.add_argument("--difficulty", default=None, help="difficulty weights (default: the shipped ones)")
    _common(sc)
    sc.set_defaults(func=cmd_score)
    router.set_defaults(func=lambda _a: (router.print_help(), 2)[1])


def register_eval(esub: Any) -> None:
    """`switchyard eval router`."""
    ev = esub.add_parser("router", help="APGR, CPT(50%%), CPT(80%%) and dollars of the classifier")
    ev.add_argument("--data", default=None, help="JSONL: prompt, weak_correct, strong_correct[, *_response]")
    ev.add_argument(
        "--multi", nargs="+", default=None,
        help="cross-task tables of the difficulty families over these files or directories",
    )  # fmt: skip
    ev.add_argument(
        "--families", default="irt,irt+len,mirt,ridge,knn", help="with --multi: families to compare"
    )
    ev.add_argument("--cache", default=None, help="with --multi: directory to cache embeddings in")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--plot", default=None, help="write the cost-quality curve as PNG")
    ev.add_argument("--scores", default=None, help="evaluate these scores (router score output) instead")
    ev.add_argument("--weights", default=None, help="router weights (default: the shipped ones)")
    ev.add_argument("--price-weak", default=None, help="USD per 1M tokens IN,OUT (default 0.60,0.60)")
    ev.add_argument("--price-strong", default=None, help="USD per 1M tokens IN,OUT (default 10,30)")
    _common(ev)
    ev.set_defaults(func=cmd_eval)
