"""Does the static (model2vec-style) embedding keep accuracy? Compares it with the ONNX MiniLM.

    python -m load_tests.static_embed_eval [--qqp-pairs N] [--dims 128 ...] [--tokenlearn] [--out DIR]

a. Speed: process-CPU ms per text, one text per call (the gateway's miss path), median of
   runs over 500 short prompts (load_tests.auto_path's); the static one also at batch 32.
b. Semantic-cache retrieval on ../shared/data/semcache/qqp-dev.jsonl (read in place; skipped
   if absent): cosine of each pair, label 1 (duplicates) vs 0; ROC AUC; share of positives
   kept and of negatives passing at fixed floors; and at the floor that keeps 90/95/99% of the
   positives (the two spaces' cosine scales differ: the recall-matched rows are the fair ones),
   how many negatives pass to the cross-encoder.
c. Router quality on ../shared/data/routing/{mmlu,gsm8k-dev}.jsonl: the complexity classifier
   (gateway.lab.router_fit.fit_router, the trainer's ALPHA / LENGTH_PRIOR / L2_GRID) on each
   backend's vectors; ``features`` = the text features alone (no embedding), as a floor.
   - trainer CV: ``switchyard train router``'s own figure (pooled out-of-fold APGR, 5 folds
     grouped by file/domain; it also picks L2 for the rows below);
   - in-distribution: random 80/20 splits (3 seeds), APGR on the held-out 20%;
   - cross-task: MMLU domains in 5 grouped folds (train on 4, test on the held-out domains;
     pooled and mean per fold), and train on all of MMLU, test on GSM8K.

``--dims``: also static tables reduced to other PCA sizes. ``--tokenlearn`` (experimental, a few
minutes): also a table fitted so that a text's mean row matches its ONNX vector (cosine, Adam),
on the QQP questions outside the evaluated pairs (no evaluated text is in it; it is the same
domain, so its QQP row is optimistic; the routing data stay out of domain for it).

Vectors are cached under /tmp/static_eval/vectors (by backend and text list); the ONNX export
and the static table are built once under /tmp/static_eval/home. One thread everywhere.
Writes static-embed-eval-<UTC>.json and .md under DIR (default load_tests/reports)."""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from gateway.lab.router_fit import Example, correctness, feature_table, fit_router, group_folds  # noqa: E402
from gateway.lab.router_metrics import router_metrics  # noqa: E402
from gateway.lab.router_train import ALPHA, FOLDS, L2_GRID, LENGTH_PRIOR, grouped_cv, read_examples  # noqa: E402
from load_tests.auto_path import DEFAULT_OUT, prompt  # noqa: E402
from load_tests.bench_procs import ROOT, machine_info  # noqa: E402
from load_tests.bench_report import save_report  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
QQP = DATA / "semcache" / "qqp-dev.jsonl"
ROUTING = (DATA / "routing" / "mmlu.jsonl", DATA / "routing" / "gsm8k-dev.jsonl")
WORK = Path("/tmp/static_eval")
HOME = WORK / "home"  # the ONNX export and the static table are built here once
CACHE = WORK / "vectors"  # embeddings by backend and text-list digest
QQP_PAIRS = 20_000  # a seeded sample (0 = all 40k); the pairs after it tuned the recipe
FLOORS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
RECALLS = (0.90, 0.95, 0.99)
QUERIES, BANK = 2000, 10_000
SPLIT_SEEDS = (0, 1, 2)

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Encode = Callable[[Sequence[str]], F32]


# ----------------------------------------------------------------------------- data, vectors
def qqp_pairs(limit: int = QQP_PAIRS) -> tuple[list[str], list[str], npt.NDArray[np.int64]]:
    rows = [json.loads(line) for line in QQP.open(encoding="utf-8") if line.strip()]
    random.Random(0).shuffle(rows)
    if limit:
        rows = rows[:limit]
    return (
        [str(r["text_a"]) for r in rows],
        [str(r["text_b"]) for r in rows],
        np.array([int(r["label"]) for r in rows], dtype=np.int64),
    )


def routing_examples() -> list[Example]:
    return read_examples(list(ROUTING))


def cached_vectors(name: str, encode: Encode, texts: list[str], chunk: int = 256) -> F32:
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"{name}-{len(texts)}-{digest}.npy"
    if path.exists():
        return np.asarray(np.load(path), dtype=np.float32)
    out = np.concatenate([encode(texts[i : i + chunk]) for i in range(0, len(texts), chunk)])
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, out)
    tmp.replace(path)
    return np.asarray(out, dtype=np.float32)


def backends(dims_variants: list[int]) -> dict[str, Encode]:
    """name -> encode: onnx, static (the shipped recipe) and static at other PCA sizes."""
    from gateway.cache import embed_backends
    from load_tests import static_embed as embed_static

    out: dict[str, Encode] = {"onnx": embed_backends.load_onnx(HOME)}
    t0, c0 = time.perf_counter(), time.process_time()
    built = not embed_static.static_path(HOME).exists()
    out["static"] = embed_static.load_static(HOME)
    if built:
        print(
            f"built the static table in {time.perf_counter() - t0:.1f} s wall, "
            f"{time.process_time() - c0:.1f} s CPU",
            file=sys.stderr,
        )
    raw_path = WORK / f"raw-mean-v{embed_static.STATIC_VERSION}.npy"
    for dims in dims_variants:
        if dims == embed_static.DIMS:
            continue
        if not raw_path.exists():
            np.save(raw_path, embed_static.token_outputs())
        table = embed_static.reduce_table(np.load(raw_path), dims).astype(np.float16)
        out[f"static{dims}"] = embed_static.encoder(np.asarray(table, dtype=np.float32))
    return out


def tokenlearn(corpus: list[str], targets: F32, steps: int = 300, lr: float = 3e-3) -> F32:
    """Experimental (model2vec's "tokenlearn" idea): start from the distilled per-token outputs
    (transformer space, no PCA) and fit the table by Adam so that the mean of a text's rows has
    the highest cosine with the transformer's vector of that text, over ``corpus``."""
    import torch
    from tokenizers import Tokenizer

    from gateway.cache import embed_backends
    from load_tests import static_embed as embed_static

    raw_path = WORK / f"raw-mean-v{embed_static.STATIC_VERSION}.npy"
    if not raw_path.exists():
        np.save(raw_path, embed_static.token_outputs())
    raw = np.load(raw_path)
    tok = Tokenizer.from_file(str(embed_backends._model_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=embed_backends.MAX_TOKENS)
    tok.no_padding()
    special = {tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    empty = len(raw) - 1
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, enc in enumerate(tok.encode_batch(corpus, add_special_tokens=False)):
        ids = [t for t in enc.ids if t not in special] or [empty]
        rows += [i] * len(ids)
        cols += ids
        vals += [1.0 / len(ids)] * len(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        mean_op = torch.sparse_coo_tensor(
            torch.tensor([rows, cols]),
            torch.tensor(vals, dtype=torch.float32),
            (len(corpus), len(raw)),
            check_invariants=False,
        ).to_sparse_csr()
    goal = torch.from_numpy(targets)
    table = torch.nn.Parameter(torch.from_numpy(raw.copy()))
    opt = torch.optim.Adam([table], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = (1 - torch.nn.functional.cosine_similarity(mean_op @ table, goal)).mean()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    print(f"tokenlearn: {len(corpus)} texts, final loss {loss.item():.4f}", file=sys.stderr)
    return np.asarray(table.detach().numpy(), dtype=np.float32)


# ----------------------------------------------------------------------------- a. speed
def speed(encode: Encode, texts: list[str], batch: int, runs: int) -> dict[str, float]:
    encode(texts[:batch])  # warm
    cpu, wall = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(texts), batch):
            encode(texts[i : i + batch])
        cpu.append((time.process_time() - c0) * 1000 / len(texts))
        wall.append((time.perf_counter() - t0) * 1000 / len(texts))
    return {
        "batch": batch,
        "cpu_ms_per_text": round(statistics.median(cpu), 4),
        "wall_ms_per_text": round(statistics.median(wall), 4),
    }


# ----------------------------------------------------------------------------- b. retrieval
def roc_auc(scores: F64, labels: npt.NDArray[np.int64]) -> float:
    """Mann-Whitney AUC with average ranks for ties."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_s = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def retrieval(
    vecs: F32, ia: npt.NDArray[np.int64], ib: npt.NDArray[np.int64], labels: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Pairs (vecs[ia[i]], vecs[ib[i]]) labelled ``labels``. Besides QQP's own (hard, same-topic)
    non-duplicates: unrelated pairs (text_a against a shuffled text_b), and a cache of
    ``BANK`` questions from none of the first ``QUERIES`` duplicate pairs, queried with those
    pairs' text_a: how many entries clear the floor (the verifier's candidates)."""
    va, vb = vecs[ia], vecs[ib]
    cos = np.sum(va.astype(np.float64) * vb, axis=1)
    pos, neg = cos[labels == 1], cos[labels == 0]
    rng = np.random.default_rng(0)
    unrelated = np.sum(va.astype(np.float64) * vecs[rng.permutation(ib)], axis=1)
    queries = ia[labels == 1][:QUERIES]
    taken = set(queries.tolist()) | set(ib[labels == 1][:QUERIES].tolist())
    others = np.array([i for i in range(len(vecs)) if i not in taken])
    bank = vecs[rng.choice(others, min(BANK, len(others)), replace=False)]
    bank_cos = vecs[queries] @ bank.T
    q = (0.05, 0.25, 0.5, 0.75, 0.95)
    at_recall = []
    for r in RECALLS:
        floor = float(np.quantile(pos, 1.0 - r))
        above = (bank_cos >= floor).sum(axis=1)
        at_recall.append(
            {
                "pos_kept": r,
                "floor": round(floor, 4),
                "neg_pass": round(float((neg >= floor).mean()), 4),
                "unrelated_pass": round(float((unrelated >= floor).mean()), 5),
                "bank_entries_above_floor_mean": round(float(above.mean()), 2),
                "bank_queries_with_none": round(float((above == 0).mean()), 4),
            }
        )
    return {
        "auc": round(roc_auc(cos, labels), 4),
        "positives": len(pos),
        "negatives": len(neg),
        "pos_quantiles": {f"p{int(x * 100)}": round(float(np.quantile(pos, x)), 4) for x in q},
        "neg_quantiles": {f"p{int(x * 100)}": round(float(np.quantile(neg, x)), 4) for x in q},
        "unrelated_quantiles": {f"p{int(x * 100)}": round(float(np.quantile(unrelated, x)), 4) for x in q},
        "floors": [
            {
                "floor": f,
                "pos_kept": round(float((pos >= f).mean()), 4),
                "neg_pass": round(float((neg >= f).mean()), 4),
                "unrelated_pass": round(float((unrelated >= f).mean()), 5),
            }
            for f in FLOORS
        ],
        "at_recall": at_recall,
        "bank": {"queries": len(queries), "entries": len(bank)},
    }


# ----------------------------------------------------------------------------- c. router
def choose_l2(emb: F32, feats: F64, weak: F64, strong: F64, groups: list[str]) -> tuple[float, float]:
    """The trainer's selection (gateway.lab.router_train.train_router): L2 with the best mean
    held-out-group APGR; returns it and the pooled out-of-fold APGR at it."""
    folds = group_folds(groups, FOLDS, 0)
    best: tuple[float, float, float] | None = None
    for lam in L2_GRID:
        oof, per_fold = grouped_cv(emb, feats, weak, strong, folds, lam)
        mean = float(np.mean(per_fold))
        if best is None or mean > best[0]:
            best = (mean, lam, router_metrics(oof, weak, strong).apgr)
    assert best is not None
    return best[1], best[2]


def held_out(
    emb: F32,
    feats: F64,
    weak: F64,
    strong: F64,
    train: npt.NDArray[np.int64],
    test: npt.NDArray[np.int64],
    lam: float,
) -> F64:
    model = fit_router(emb[train], feats[train], weak[train], strong[train], lam, ALPHA, LENGTH_PRIOR)
    return model.scores(emb[test], feats[test])


def router_quality(emb: F32, examples: list[Example]) -> dict[str, Any]:
    feats = feature_table(examples)
    weak, strong = correctness(examples)
    groups = [e.group for e in examples]
    lam, trainer_cv = choose_l2(emb, feats, weak, strong, groups)
    n = len(examples)
    in_dist = []
    for seed in SPLIT_SEEDS:
        perm = np.random.default_rng(seed).permutation(n)
        test, train = np.sort(perm[: n // 5]), np.sort(perm[n // 5 :])
        s = held_out(emb, feats, weak, strong, train, test, lam)
        in_dist.append(router_metrics(s, weak[test], strong[test]).apgr)
    mmlu = np.array([i for i, g in enumerate(groups) if g.startswith("mmlu/")])
    gsm = np.array([i for i, g in enumerate(groups) if not g.startswith("mmlu/")])
    per_fold, pooled_scores, pooled_idx = [], [], []
    for fold in group_folds([groups[i] for i in mmlu], FOLDS, 0):
        test = mmlu[fold]
        train = np.setdiff1d(mmlu, test)
        s = held_out(emb, feats, weak, strong, train, test, lam)
        per_fold.append(router_metrics(s, weak[test], strong[test]).apgr)
        pooled_scores.append(s)
        pooled_idx.append(test)
    idx = np.concatenate(pooled_idx)
    pooled = router_metrics(np.concatenate(pooled_scores), weak[idx], strong[idx]).apgr
    s = held_out(emb, feats, weak, strong, mmlu, gsm, lam)
    to_gsm = router_metrics(s, weak[gsm], strong[gsm])
    return {
        "l2": lam,
        "trainer_cv_oof_apgr": round(trainer_cv, 4),
        "in_distribution_apgr": round(float(np.mean(in_dist)), 4),
        "in_distribution_per_seed": [round(a, 4) for a in in_dist],
        "mmlu_domain_holdout_apgr_pooled": round(pooled, 4),
        "mmlu_domain_holdout_apgr_fold_mean": round(float(np.mean(per_fold)), 4),
        "mmlu_domain_holdout_per_fold": [round(a, 4) for a in per_fold],
        "mmlu_to_gsm8k_apgr": round(to_gsm.apgr, 4),
        "mmlu_to_gsm8k_cpt50": round(to_gsm.cpt50, 2),
    }


# ----------------------------------------------------------------------------- report
def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    names = list(report["speed"])
    lines = [
        f"# Static (model2vec-style) embedding vs ONNX MiniLM — {report['timestamp']}",
        "",
        f"- Machine: {m['nproc']} CPUs, {m['cpu_model']}; load average at start {m['loadavg_at_start']}",
        f"- Static table: {report['static_table']}",
        "",
        "## a. Speed (500 short prompts, process CPU, median of runs)",
        "",
        "| backend | batch | CPU ms/text | wall ms/text |",
        "|---|---|---|---|",
    ]
    for name in names:
        for row in report["speed"][name]:
            lines.append(
                f"| {name} | {row['batch']} | {row['cpu_ms_per_text']:.4f} | {row['wall_ms_per_text']:.4f} |"
            )
    qqp = report.get("qqp")
    lines += ["", "## b. Semantic-cache retrieval (QQP pairs, cosine)", ""]
    if not qqp:
        lines.append(f"skipped: {report.get('qqp_skipped')}")
    else:
        first = next(iter(qqp.values()))
        lines += [
            f"{report['qqp_pairs']} pairs: {first['positives']} duplicates, "
            f"{first['negatives']} non-duplicates.",
            "",
            "| backend | ROC AUC | pos p5 / p50 | neg p50 / p95 |"
            + "".join(f" neg pass @ {int(r * 100)}% pos kept (floor) |" for r in RECALLS),
            "|---|---|---|---|" + "---|" * len(RECALLS),
        ]
        for name, r in qqp.items():
            at = "".join(f" {a['neg_pass']:.3f} ({a['floor']:.3f}) |" for a in r["at_recall"])
            pq, nq = r["pos_quantiles"], r["neg_quantiles"]
            lines.append(
                f"| {name} | {r['auc']:.4f} | {pq['p5']:.3f} / {pq['p50']:.3f} | "
                f"{nq['p50']:.3f} / {nq['p95']:.3f} |{at}"
            )
        lines += [
            "",
            f"At the floor keeping X% of duplicates: QQP non-duplicates passing / unrelated pairs "
            f"passing / entries above the floor per query in a cache of {BANK:,} unrelated questions "
            "(share of queries with none)",
            "",
            "| backend |" + "".join(f" {int(r * 100)}% kept |" for r in RECALLS),
            "|---|" + "---|" * len(RECALLS),
        ]
        for name, r in qqp.items():
            cells = "".join(
                f" {a['neg_pass']:.3f} / {a['unrelated_pass']:.4f} / "
                f"{a['bank_entries_above_floor_mean']:.1f} ({a['bank_queries_with_none']:.2f}) |"
                for a in r["at_recall"]
            )
            lines.append(f"| {name} |{cells}")
        lines += ["", "Fixed floors: positives kept / negatives passing", ""]
        lines.append("| floor |" + "".join(f" {n} |" for n in qqp))
        lines.append("|---|" + "---|" * len(qqp))
        for i, f in enumerate(FLOORS):
            cells = "".join(
                f" {r['floors'][i]['pos_kept']:.3f} / {r['floors'][i]['neg_pass']:.3f} |"
                for r in qqp.values()
            )
            lines.append(f"| {f:.2f} |{cells}")
    router = report.get("router")
    lines += ["", "## c. Router quality (APGR; 0.5 = random, higher is better)", ""]
    if not router:
        lines.append(f"skipped: {report.get('router_skipped')}")
    else:
        lines += [
            "| embedding | l2 | trainer CV (grouped OOF) | in-distribution (80/20, 3 seeds) | "
            "MMLU held-out domains (pooled / fold mean) | MMLU -> GSM8K |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in router.items():
            lines.append(
                f"| {name} | {r['l2']:g} | {r['trainer_cv_oof_apgr']:.4f} | "
                f"{r['in_distribution_apgr']:.4f} | {r['mmlu_domain_holdout_apgr_pooled']:.4f} / "
                f"{r['mmlu_domain_holdout_apgr_fold_mean']:.4f} | {r['mmlu_to_gsm8k_apgr']:.4f} |"
            )
    lines += ["", f"Elapsed: {report['elapsed_s']} s"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--qqp-pairs", type=int, default=QQP_PAIRS, help="0 = all")
    ap.add_argument("--dims", type=int, nargs="*", default=[], help="also static tables of these PCA sizes")
    ap.add_argument(
        "--tokenlearn",
        action="store_true",
        help="also a table fitted to the ONNX vectors of the QQP questions outside the evaluated pairs",
    )
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from load_tests import static_embed as embed_static

    start = time.perf_counter()
    report: dict[str, Any] = {
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
    }
    encs = backends(args.dims)
    if args.tokenlearn and QQP.exists():
        every_a, every_b, _ = qqp_pairs(0)
        held = set(every_a[: args.qqp_pairs or None]) | set(every_b[: args.qqp_pairs or None])
        corpus = sorted((set(every_a) | set(every_b)) - held)
        if corpus:
            targets = cached_vectors("onnx", encs["onnx"], corpus)
            encs["static-tokenlearn"] = embed_static.encoder(tokenlearn(corpus, targets))
    path = embed_static.static_path(HOME)
    report["static_table"] = f"{path.name}, {path.stat().st_size / 1e6:.1f} MB"

    short = [prompt(i, 7) for i in range(500)]
    report["speed"] = {}
    for name, enc in encs.items():
        rows = [speed(enc, short, 1, args.runs if name != "onnx" else 3)]
        if name != "onnx":
            rows.append(speed(enc, short, 32, args.runs))
        report["speed"][name] = rows
        print(f"speed {name}: {rows}", file=sys.stderr)

    version = embed_static.STATIC_VERSION
    vec_names = {n: f"{n}-v{version}" if n.startswith("static") else n for n in encs}
    if QQP.exists():
        a, b, labels = qqp_pairs(args.qqp_pairs)
        texts = sorted(set(a) | set(b))
        where = {t: i for i, t in enumerate(texts)}
        ia, ib = np.array([where[t] for t in a]), np.array([where[t] for t in b])
        report["qqp_pairs"] = len(a)
        report["qqp"] = {}
        for name, enc in encs.items():
            vecs = cached_vectors(vec_names[name], enc, texts)
            report["qqp"][name] = retrieval(vecs, ia, ib, labels)
            print(f"qqp {name}: auc {report['qqp'][name]['auc']}", file=sys.stderr)
    else:
        report["qqp_skipped"] = f"{QQP} absent"
        print(f"{QQP} absent: retrieval skipped", file=sys.stderr)

    if all(p.exists() for p in ROUTING):
        examples = routing_examples()
        prompts = [e.prompt for e in examples]
        report["router"] = {}
        embs = {name: cached_vectors(vec_names[name], enc, prompts) for name, enc in encs.items()}
        embs["features"] = np.zeros((len(examples), 0), dtype=np.float32)
        for name, emb in embs.items():
            report["router"][name] = router_quality(emb, examples)
            print(f"router {name}: {report['router'][name]}", file=sys.stderr)
    else:
        report["router_skipped"] = "routing data absent"
        print("routing data absent: router quality skipped", file=sys.stderr)

    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    stem = args.out / f"static-embed-eval-{report['timestamp'].replace(':', '')}"
    md = render(report)
    save_report(stem, report, md)
    print(md)
    print(f"wrote {stem}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
