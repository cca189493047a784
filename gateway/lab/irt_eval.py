"""Cross-task evaluation of the difficulty families (`switchyard eval router --irt`).

Splits (a prompt is always scored by a model fitted without its split):
- ``leave-one-source-out`` (the headline): every data file is scored by a model fitted on the
  other files only; its models are unseen, so the score is the prompt's difficulty;
- ``held-out tasks``: inside each file, its tasks are dealt into up to 5 folds; each fold is
  scored by a model fitted on everything else (the file's other tasks included).

For each file, up to three weak/strong pairs with a clear accuracy gap (>= 10 points) are
scored: the best model against the weak models nearest to 10, 20 and 30 points below it.
Every router is shown beside random (mean of 10 seeds), prompt length and the oracle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.lab.irt_data import F64, Table, dense, dense_chars
from gateway.lab.irt_fit import F32, FAMILIES, Fit, fit_family
from gateway.lab.router_metrics import cost_at_quality, cost_curve, oracle_scores, router_metrics
from gateway.routing.features import FEATURE_NAMES

GAP = 0.10
FOLDS = 5
DEFAULT_PRICES = ((0.60, 0.60), (10.0, 30.0))  # weak, strong USD per 1M in/out, when a source has none
OUTPUT_TOKENS = 256.0
LOG_CHARS = FEATURE_NAMES.index("log_chars")
LENGTH_PRIOR = 0.5  # sds of log prompt chars added to a '+len' family's difficulty (v1's prior)


@dataclass(frozen=True, slots=True)
class Pair:
    source: str
    weak: int  # model column
    strong: int
    weak_acc: float
    strong_acc: float


def choose_pairs(table: Table, y: F64) -> list[Pair]:
    src = np.array(table.source)
    out: list[Pair] = []
    for s in sorted(set(table.source)):
        rows = src == s
        cols = [j for j, name in enumerate(table.models) if name.startswith(f"{s}/")]
        full = [j for j in cols if np.isfinite(y[rows, j]).mean() >= 0.95 and np.nanstd(y[rows, j]) > 0.05]
        acc = {j: float(np.nanmean(y[rows, j])) for j in full}
        if len(acc) < 2:
            continue
        best = max(acc, key=lambda j: acc[j])
        picked: list[int] = []
        for below in (0.10, 0.20, 0.30):
            weak = [j for j in acc if acc[best] - acc[j] >= GAP and j not in picked]
            if weak:
                picked.append(min(weak, key=lambda j: abs(acc[best] - acc[j] - below)))
        out += [Pair(s, j, best, acc[j], acc[best]) for j in picked]
    return out


EVAL_MAXITER = 150  # L-BFGS iterations of the cross-task fits (the shipped fit runs 300)
Fits = dict[tuple[str, bytes], Fit]  # one report's fits, so "irt+len" reuses "irt"'s


def _fit(fam: str, table: Table, emb: F32, feats: F64, train: np.ndarray, seed: int, fits: Fits) -> Fit:
    key = (fam, np.packbits(train).tobytes())
    if key not in fits:
        fits[key] = _fit_once(fam, table, emb, feats, train, seed)
    return fits[key]


def _fit_once(fam: str, table: Table, emb: F32, feats: F64, train: np.ndarray, seed: int) -> Fit:
    keep = train[table.rows]
    remap = -np.ones(len(table.prompts), dtype=np.int64)
    remap[train] = np.arange(int(train.sum()))
    used = np.unique(table.cols[keep])
    cmap = -np.ones(len(table.models), dtype=np.int64)
    cmap[used] = np.arange(len(used))
    return fit_family(
        fam, emb[train], feats[train], [s for s, t in zip(table.source, train, strict=True) if t],
        remap[table.rows[keep]], cmap[table.cols[keep]], table.y[keep],
        tuple(table.models[j] for j in used), seed=seed, maxiter=EVAL_MAXITER,
    )  # fmt: skip


def _scores(
    fam: str, table: Table, emb: F32, feats: F64, train: np.ndarray, test: np.ndarray, seed: int, fits: Fits
) -> F64:
    base, _, plus = fam.partition("+")
    fit = _fit(base, table, emb, feats, train, seed, fits)
    d_test = fit.difficulty(emb[test], feats[test])
    if not plus:
        return d_test
    # "<family>+len": the difficulty plus a prompt-length prior, both in training sds
    d_train = fit.difficulty(emb[train], feats[train])
    lc = feats[:, LOG_CHARS]
    z_len = (lc[test] - lc[train].mean()) / (lc[train].std() or 1.0)
    return np.asarray((d_test - d_train.mean()) / (d_train.std() or 1.0) + LENGTH_PRIOR * z_len)


def split_scores(
    table: Table, emb: F32, feats: F64, families: tuple[str, ...], seed: int
) -> dict[str, dict[str, F64]]:
    """split name -> family -> out-of-split difficulty of every prompt (NaN where not scored)."""
    src = np.array(table.source)
    task = np.array(table.task)
    out: dict[str, dict[str, F64]] = {"leave-one-source-out": {}, "held-out tasks": {}}
    fits: Fits = {}
    for fam in families:
        loso = np.full(len(src), np.nan)
        for s in sorted(set(table.source)):
            test = src == s
            loso[test] = _scores(fam, table, emb, feats, ~test, test, seed, fits)
        out["leave-one-source-out"][fam] = loso
        held = np.full(len(src), np.nan)
        for s in sorted(set(table.source)):
            names = sorted(set(task[src == s]))
            if len(names) < 2:
                continue
            rng = np.random.default_rng(seed)
            rng.shuffle(names)
            for f in range(min(FOLDS, len(names))):
                test = np.isin(task, names[f::FOLDS])
                held[test] = _scores(fam, table, emb, feats, ~test, test, seed, fits)
        out["held-out tasks"][fam] = held
    return out


def _costs(table: Table, pair: Pair, rows: np.ndarray, prices: dict[str, Any]) -> tuple[F64, F64]:
    chars = dense_chars(table)
    tin = np.array([len(table.prompts[i]) / 4.0 for i in np.flatnonzero(rows)])

    def one(j: int, default: tuple[float, float]) -> F64:
        name = table.models[j].split("/", 1)[1]
        p = prices.get(pair.source, {}).get(name)
        pin, pout = (p["input_price"], p["output_price"]) if p else default
        out = chars[rows, j] / 4.0
        out = np.where(np.isfinite(out), out, OUTPUT_TOKENS)
        return np.asarray((tin * pin + out * pout) / 1e6, dtype=np.float64)

    return one(pair.weak, DEFAULT_PRICES[0]), one(pair.strong, DEFAULT_PRICES[1])


def pair_rows(
    table: Table, feats: F64, scores: dict[str, F64], pair: Pair, prices: dict[str, Any]
) -> list[dict[str, Any]]:
    y = dense(table)
    src = np.array(table.source)
    rows = (src == pair.source) & np.isfinite(y[:, pair.weak]) & np.isfinite(y[:, pair.strong])
    rows &= np.all([np.isfinite(s) for s in scores.values()], axis=0) if scores else rows
    if rows.sum() < 20:  # a file with one task has no held-out-task split
        return []
    weak, strong = y[rows, pair.weak], y[rows, pair.strong]
    wc, sc = _costs(table, pair, rows, prices)
    target = 0.95 * float(strong.mean()) * 100.0
    rng = np.random.default_rng(0)
    routers = [(f, s[rows]) for f, s in scores.items()]
    routers += [("prompt-length", feats[rows, LOG_CHARS]), ("oracle", oracle_scores(weak, strong))]
    routers += [(f"random#{i}", rng.random(int(rows.sum()))) for i in range(10)]
    out: list[dict[str, Any]] = []
    for name, s in routers:
        m = router_metrics(s, weak, strong)
        c = cost_at_quality(cost_curve(s, weak, strong, wc, sc), target)
        out.append(
            {"router": name, "apgr": m.apgr, "cpt50": m.cpt50, "cpt80": m.cpt80,
             "cost95": None if c is None else 100.0 * c / float(sc.sum())}
        )  # fmt: skip
    rnd = [r for r in out if r["router"].startswith("random#")]
    out = [r for r in out if not r["router"].startswith("random#")]
    mean = {
        k: float(np.mean([r[k] for r in rnd if r[k] is not None]))
        for k in ("apgr", "cpt50", "cpt80", "cost95")
    }
    out.insert(len(scores), {"router": "random", **mean})
    base = {"source": pair.source, "weak": table.models[pair.weak].split("/", 1)[1],
            "strong": table.models[pair.strong].split("/", 1)[1], "n": int(rows.sum()),
            "weak_acc": float(weak.mean()), "strong_acc": float(strong.mean())}  # fmt: skip
    return [{**base, **r} for r in out]


def report(
    table: Table, emb: F32, feats: F64, prices: dict[str, Any], seed: int = 0,
    families: tuple[str, ...] = FAMILIES, extra: dict[str, F64] | None = None,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """split -> one row per (pair, router)."""
    y = dense(table)
    pairs = choose_pairs(table, y)
    splits = split_scores(table, emb, feats, families, seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for split, scores in splits.items():
        if extra:
            scores = {**scores, **extra}
        out[split] = [r for p in pairs for r in pair_rows(table, feats, scores, p, prices)]
    return out


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, fmt)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Per router: mean and min APGR over the pairs, mean CPTs and cost, pairs beating length."""
    routers = list(dict.fromkeys(r["router"] for r in rows))
    length = {(r["source"], r["weak"]): r["apgr"] for r in rows if r["router"] == "prompt-length"}
    lines = [
        "| router | pairs | mean APGR | min APGR | mean CPT(50%) | mean CPT(80%) "
        "| mean cost at 95% (% of strong) | beats length by >= 0.05 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in routers:
        rs = [r for r in rows if r["router"] == name]
        apgr = [r["apgr"] for r in rs]
        cost = [r["cost95"] for r in rs if r["cost95"] is not None]
        beat = sum(r["apgr"] >= length[(r["source"], r["weak"])] + 0.05 for r in rs)
        lines.append(
            f"| {name} | {len(rs)} | {np.mean(apgr):.3f} | {np.min(apgr):.3f} "
            f"| {np.mean([r['cpt50'] for r in rs]):.1f}% | {np.mean([r['cpt80'] for r in rs]):.1f}% "
            f"| {_f(float(np.mean(cost)) if cost else None, '.1f')}% | {beat}/{len(rs)} |"
        )
    return "\n".join(lines)


def pair_table(rows: list[dict[str, Any]], routers: tuple[str, ...]) -> str:
    lines = [
        "| source | weak -> strong | n | acc weak/strong | router | APGR | CPT(50%) | CPT(80%) "
        "| cost at 95% |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["router"] not in routers:
            continue
        lines.append(
            f"| {r['source']} | {r['weak']} -> {r['strong']} | {r['n']} "
            f"| {r['weak_acc']:.2f}/{r['strong_acc']:.2f} | {r['router']} | {r['apgr']:.3f} "
            f"| {r['cpt50']:.1f}% | {r['cpt80']:.1f}% | {_f(r['cost95'], '.1f')}% |"
        )
    return "\n".join(lines)
