"""Cross-task evaluation of the difficulty families (`switchyard eval router --irt`).

Splits (a prompt is always scored by a model fitted without its split):
- ``leave-one-source-out`` (the headline): every data file is scored by a model fitted on the
  other files only; its models are unseen, so the score is the prompt's difficulty;
- ``held-out tasks``: inside each file, its tasks are dealt into up to 5 folds; each fold is
  scored by a model fitted on everything else (the file's other tasks included).

For each file, up to three weak/strong pairs with a clear accuracy gap (>= 10 points) are
scored: the best model against the weak models nearest to 10, 20 and 30 points below it.
Every router is shown beside random (mean of 10 seeds), prompt length and the oracle, and,
where the source has other models, the ``ceiling`` of any pair-agnostic difficulty score: the
prompt scored by minus the mean outcome of the source's other models on it (their measured
difficulty, labels a router never has). Where that ceiling is low, the pair's outcome is not a
function of how hard the prompt is, and no difficulty model can route it well. ``ceiling+len``
adds prompt length at the weight best for that pair in hindsight (an upper bound of any
difficulty-plus-length blend)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.lab.difficulty_designs import DESIGNS, DesignFit, fit_design
from gateway.lab.irt_data import F64, Table, dense, dense_chars
from gateway.lab.irt_fit import F32, FAMILIES, Fit, fit_family
from gateway.lab.router_metrics import cost_at_quality, cost_curve, oracle_scores, router_metrics
from gateway.routing.features import FEATURE_NAMES
from gateway.routing.prompt_traits import trait_matrix

GAP = 0.10
FOLDS = 5
DEFAULT_PRICES = ((0.60, 0.60), (10.0, 30.0))  # weak, strong USD per 1M in/out, when a source has none
OUTPUT_TOKENS = 256.0
LOG_CHARS = FEATURE_NAMES.index("log_chars")
LENGTH_PRIOR = 0.5  # sds of log prompt chars added to a '+len' family's difficulty (v1's prior)
LENGTH_GRID = tuple(round(-1.0 + 0.25 * i, 2) for i in range(13))  # '+lenfit': weights tried, -1..2


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
Fits = dict[tuple[str, bytes], "Fit | DesignFit"]  # one report's fits, so "irt+len" reuses "irt"'s


@dataclass(frozen=True, slots=True)
class Data:
    """What every fit of one report reads: the table, its embeddings, the 17 text features and
    (for the designs of gateway.lab.difficulty_designs) the features followed by the traits."""

    table: Table
    emb: F32
    feats: F64
    xfeats: F64
    y: F64  # dense outcomes
    pairs: list[Pair]
    seed: int


def _fit(fam: str, data: Data, train: np.ndarray, fits: Fits) -> Fit | DesignFit:
    key = (fam, np.packbits(train).tobytes())
    if key not in fits:
        fits[key] = _fit_once(fam, data, train)
    return fits[key]


def _fit_once(fam: str, data: Data, train: np.ndarray) -> Fit | DesignFit:
    table = data.table
    keep = train[table.rows]
    remap = -np.ones(len(table.prompts), dtype=np.int64)
    remap[train] = np.arange(int(train.sum()))
    used = np.unique(table.cols[keep])
    cmap = -np.ones(len(table.models), dtype=np.int64)
    cmap[used] = np.arange(len(used))
    sources = [s for s, t in zip(table.source, train, strict=True) if t]
    rows, cols, y = remap[table.rows[keep]], cmap[table.cols[keep]], table.y[keep]
    models = tuple(table.models[j] for j in used)
    if fam in DESIGNS:
        return fit_design(fam, data.emb[train], data.xfeats[train], sources, rows, cols, y, models)
    return fit_family(
        fam, data.emb[train], data.feats[train], sources, rows, cols, y, models,
        seed=data.seed, maxiter=EVAL_MAXITER,
    )  # fmt: skip


def _difficulty(fit: Fit | DesignFit, data: Data, rows: np.ndarray) -> F64:
    if isinstance(fit, DesignFit):
        return fit.difficulty(data.emb[rows], data.xfeats[rows])
    return fit.difficulty(data.emb[rows], data.feats[rows])


def _standardised(base: str, data: Data, train: np.ndarray, test: np.ndarray, fits: Fits) -> tuple[F64, F64]:
    """(difficulty, log prompt length) of the test prompts, each in training sds."""
    fit = _fit(base, data, train, fits)
    d_test, d_train = _difficulty(fit, data, test), _difficulty(fit, data, train)
    lc = data.feats[:, LOG_CHARS]
    z_len = (lc[test] - lc[train].mean()) / (lc[train].std() or 1.0)
    return (d_test - d_train.mean()) / (d_train.std() or 1.0), np.asarray(z_len)


def learn_length_weight(base: str, data: Data, train: np.ndarray, fits: Fits) -> float:
    """'+lenfit': the weight of the length prior that maximises the mean APGR, over the pairs
    of the training sources, of scores from fits that leave that source out too (so the
    weight never sees the prompts it will score)."""
    src = np.array(data.table.source)
    gains: list[F64] = []
    for s in sorted(set(src[train])):
        inner_test = train & (src == s)
        inner_train = train & (src != s)
        if not inner_train.any():
            continue
        d, z_len = _standardised(base, data, inner_train, inner_test, fits)
        full_d = np.full(len(src), np.nan)
        full_l = np.full(len(src), np.nan)
        full_d[inner_test], full_l[inner_test] = d, z_len
        for pair in (p for p in data.pairs if p.source == s):
            ok = inner_test & np.isfinite(data.y[:, pair.weak]) & np.isfinite(data.y[:, pair.strong])
            if ok.sum() < 20:
                continue
            weak, strong = data.y[ok, pair.weak], data.y[ok, pair.strong]
            apgr = [router_metrics(full_d[ok] + w * full_l[ok], weak, strong).apgr for w in LENGTH_GRID]
            gains.append(np.array(apgr))
    if not gains:
        return LENGTH_PRIOR
    return float(LENGTH_GRID[int(np.argmax(np.mean(gains, axis=0)))])


def _scores(fam: str, data: Data, train: np.ndarray, test: np.ndarray, fits: Fits) -> F64:
    base, _, plus = fam.partition("+")
    if not plus:
        return _difficulty(_fit(base, data, train, fits), data, test)
    # "<family>+len": the difficulty plus a prompt-length prior, both in training sds;
    # "+lenfit": with the prior's weight learnt on the training sources (see learn_length_weight)
    d, z_len = _standardised(base, data, train, test, fits)
    w = learn_length_weight(base, data, train, fits) if plus == "lenfit" else LENGTH_PRIOR
    return np.asarray(d + w * z_len)


def split_scores(
    table: Table, emb: F32, feats: F64, families: tuple[str, ...], seed: int
) -> dict[str, dict[str, F64]]:
    """split name -> family -> out-of-split difficulty of every prompt (NaN where not scored)."""
    src = np.array(table.source)
    task = np.array(table.task)
    y = dense(table)
    designs = any(f.partition("+")[0] in DESIGNS for f in families)
    xfeats = np.hstack([feats, trait_matrix(table.prompts)]) if designs else feats
    data = Data(table, emb, feats, xfeats, y, choose_pairs(table, y), seed)
    out: dict[str, dict[str, F64]] = {"leave-one-source-out": {}, "held-out tasks": {}}
    fits: Fits = {}
    for fam in families:
        loso = np.full(len(src), np.nan)
        for s in sorted(set(table.source)):
            test = src == s
            loso[test] = _scores(fam, data, ~test, test, fits)
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
                held[test] = _scores(fam, data, ~test, test, fits)
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


def _with_best_length(score: F64, log_chars: F64, weak: F64, strong: F64) -> F64:
    """``ceiling+len``: the score plus the length prior at the weight (-2..2 sds) that is best on
    this very pair, in hindsight: what difficulty and length together could reach at most."""

    def z(v: F64) -> F64:
        return np.asarray((v - v.mean()) / (v.std() or 1.0))

    best = max(
        np.linspace(-2.0, 2.0, 17),
        key=lambda w: router_metrics(z(score) + w * z(log_chars), weak, strong).apgr,
    )
    return np.asarray(z(score) + best * z(log_chars))


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
    others = [
        j for j, name in enumerate(table.models)
        if name.startswith(f"{pair.source}/") and j not in (pair.weak, pair.strong)
        and np.isfinite(y[rows, j]).mean() >= 0.5
    ]  # fmt: skip
    if others:  # not routers: the in-source mean outcome of the other models (see the docstring)
        ceiling = -np.nan_to_num(np.nanmean(y[np.ix_(rows, others)], axis=1), nan=0.5)
        routers.append(("ceiling", ceiling))
        routers.append(("ceiling+len", _with_best_length(ceiling, feats[rows, LOG_CHARS], weak, strong)))
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
