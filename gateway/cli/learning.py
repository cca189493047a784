"""`switchyard feedback import | quality`, `switchyard tasks`, `switchyard eval routing` and
`switchyard eval routing-stream`; and the learned route's estimates for `policy simulate`."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.config.settings import Settings
from gateway.core.errors import BadRequestError
from gateway.flow.learning import parse
from gateway.ledger.feedback import QUALITY_GROUPS, FeedbackStore
from gateway.ledger.sqlite import is_postgres_url, ledger_path
from gateway.routing.learned_routes import LearnedRoutes, abilities
from gateway.routing.plan import RoutePlan


def _url(args: argparse.Namespace) -> str:
    return str(args.ledger or Settings.from_env().ledger_url)


def _missing(url: str) -> str | None:
    if is_postgres_url(url) or ledger_path(url).is_file():
        return None
    return f"no ledger at {ledger_path(url)}: check SWITCHYARD_HOME, SWITCHYARD_LEDGER or --ledger"


def _labels(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a JSON-lines or CSV (request_id,score) file, numbered."""
    with path.open(encoding="utf-8") as fh:
        if path.suffix.lower() == ".csv":
            for n, row in enumerate(csv.DictReader(fh), 2):
                try:
                    yield n, {"request_id": row["request_id"], "score": float(row["score"])}
                except (KeyError, ValueError):
                    yield n, row
            return
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError:
                    yield n, None


def cmd_feedback_import(args: argparse.Namespace) -> int:
    url = _url(args)
    why = _missing(url)
    if why:
        print(f"switchyard feedback import: {why}", file=sys.stderr)
        return 1
    rows: list[tuple[str, float]] = []
    for n, data in _labels(Path(args.file)):
        try:
            rows.append(parse(data))
        except BadRequestError as exc:
            print(
                f"switchyard feedback import: {args.file}:{n}: {exc.message}; nothing imported",
                file=sys.stderr,
            )
            return 2
    store = FeedbackStore(url)
    try:
        stored, unknown = store.import_scores(rows)
    finally:
        store.close()
    print(json.dumps({"stored": stored, "unknown": len(unknown), "unknown_ids": unknown[:20]}))
    return 0 if not unknown else 1


def _quality(args: argparse.Namespace, by: tuple[str, ...]) -> int:
    url = _url(args)
    why = _missing(url)
    if why:
        print(f"switchyard: {why}", file=sys.stderr)
        return 1
    store = FeedbackStore(url)
    try:
        lines = store.quality(by, tenant=args.tenant)
    finally:
        store.close()
    out = [
        {
            **dict(zip(by, line.group, strict=True)),
            "requests": line.requests,
            "cost_usd": f"{line.cost_usd:f}",
            "rated": line.rated,
            "quality": None if line.quality is None else round(line.quality, 4),
        }
        for line in lines
    ]
    if args.json:
        print(json.dumps(out))
        return 0
    cols = [*by, "requests", "cost_usd", "rated", "quality"]
    print("\t".join(cols))
    for row in out:
        print("\t".join("-" if row[c] is None else str(row[c]) for c in cols))
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    return _quality(args, ("tenant", "task", "model"))


def cmd_feedback_quality(args: argparse.Namespace) -> int:
    by = tuple(b.strip() for b in args.by.split(",") if b.strip())
    bad = [b for b in by if b not in QUALITY_GROUPS]
    if not by or bad:
        print(f"switchyard feedback quality: --by takes {', '.join(QUALITY_GROUPS)}", file=sys.stderr)
        return 2
    return _quality(args, by)


def cmd_eval_routing(args: argparse.Namespace) -> int:
    from gateway.lab.learned_designs import DESIGNS
    from gateway.lab.learned_eval import half, read_stream, report
    from gateway.routing.learned import LearnSettings

    stream = read_stream(Path(args.stream))
    if args.half is not None:
        stream = half(stream, args.half)
    settings = LearnSettings(quality_target=args.quality_target, task_floor=args.task_floor)
    if args.per_prompt:
        if args.reveal != "served" or args.design:
            print("switchyard eval routing: --per-prompt takes no --reveal or --design", file=sys.stderr)
            return 2
        return _per_prompt(args, stream, settings)
    if args.design and args.design not in DESIGNS:
        print(f"switchyard eval routing: --design: one of {', '.join(sorted(DESIGNS))}", file=sys.stderr)
        return 2
    if args.design and args.reveal != "served":
        print("switchyard eval routing: --design takes no --reveal", file=sys.stderr)
        return 2
    result = report(stream, settings, seeds=args.seeds, reveal=args.reveal, design=args.design)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['rows']} requests, {result['models']} models, {result['tasks']} tasks; seeds {args.seeds}"
    )
    _print_table(result["table"])
    worst = result["worst_task_vs_its_best"]
    share, paid = result["explored_share"], result["explore_cost_vs_best"]
    print(f"explored {share:.1%} of requests ({paid:.1%} of the best single model's cost)")
    print(f"worst task with >= 100 requests: {worst['task']} at {worst['ratio']:.1%} of its best")
    runs = result["orderings"]
    under = [r for r in runs if (r["quality_vs_best"] or 0.0) < args.quality_target]
    wrong = sum(1 for r in under if r["believed_best"] != result["best_single"])
    print(
        f"orderings under the quality target: {len(under)} of {len(runs)}"
        f" ({wrong} of them ended taking another model for the best single one)"
    )
    floor = result["tasks_at_floor"]
    print(
        f"tasks with >= 100 requests at the floor or above: {floor['met']} of {floor['of']} (all orderings)"
    )
    return 0


def _per_prompt(args: argparse.Namespace, stream: Any, settings: Any) -> int:
    """`eval routing --per-prompt`: the learned route with and without a per-prompt scorer on
    its mixes (lab/learned_per_prompt.py), paired."""
    from gateway.cache.embedder import load_embedder
    from gateway.lab.learned_per_prompt import difficulty_score, paired
    from gateway.lab.per_prompt_scorers import score_stream

    data = [Path(d) for d in (args.data or DEFAULT_DATA)]
    if args.per_prompt == "difficulty" and args.scorer_weights is None and not all(d.is_dir() for d in data):
        print(f"switchyard eval routing: no labelled data at {', '.join(map(str, data))}", file=sys.stderr)
        return 1
    weights = Path(args.scorer_weights) if args.scorer_weights else None
    cache = Path(args.cache) if args.cache else None
    log = (lambda _m: None) if args.json else (lambda m: print(m, file=sys.stderr))
    scored = score_stream(
        args.per_prompt,
        [r.prompt for r in stream.rows],
        data,
        load_embedder(args.embedder),
        cache,
        weights,
        log,
    )
    result = paired(stream, settings, difficulty_score(scored.scores), seeds=args.seeds)
    result["scorer"] = {
        "kind": args.per_prompt,
        "trained_on": scored.trained_on,
        "left_out": scored.left_out,
        "stream_prompts_seen_in_training": scored.seen,
        "ms_per_prompt": {"p50": scored.ms_p50, "p99": scored.ms_p99},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    sc = result["scorer"]
    print(f"{result['rows']} requests; seeds {result['seeds']}; per-prompt scorer: {args.per_prompt}")
    print(
        f"scorer trained on {', '.join(sc['trained_on'])} (left out: {', '.join(sc['left_out']) or '-'}); "
        f"stream prompts seen in its training: {sc['stream_prompts_seen_in_training']}"
    )
    _print_table(result["table"])
    d = result["difference"]
    print(
        f"per-prompt minus plain: quality vs best {d['quality_vs_best']:+}, "
        f"cost vs best {d['cost_vs_best']:+}"
    )
    d = result["control_difference"]
    print(
        f"random score minus plain (the replay's noise): quality vs best {d['quality_vs_best']:+}, "
        f"cost vs best {d['cost_vs_best']:+}"
    )
    print(
        f"mix decisions: {result['mix_share']:.1%} of requests; scorer AUC within (task, pair): "
        f"cheaper fails {result['auc_cheaper_fails']}, dearer does better {result['auc_dearer_better']}"
    )
    ms = sc["ms_per_prompt"]
    print(
        f"scorer time per prompt (embedding + score, one at a time): p50 {ms['p50']} ms, p99 {ms['p99']} ms"
    )
    return 0


def _print_table(table: list[dict[str, Any]]) -> None:
    print("| line | quality | vs best | cost USD | vs best |\n| --- | ---: | ---: | ---: | ---: |")
    for r in table:
        cells = (r["line"], r["quality"], r["quality_vs_best"], r["cost_usd"], r["cost_vs_best"])
        print("| " + " | ".join(map(str, cells)) + " |")


DEFAULT_DATA = ("../shared/data/routing-multi", "../shared/data/routing")


def cmd_eval_routing_stream(args: argparse.Namespace) -> int:
    from gateway.lab.learned_streams import write

    data = Path(args.data)
    if not data.is_dir():
        print(f"switchyard eval routing-stream: no data folder at {data}", file=sys.stderr)
        return 1
    n = write(args.source, data, Path(args.out), args.abilities)
    print(json.dumps({"rows": n, "out": args.out}))
    return 0


def cmd_eval_cascade(args: argparse.Namespace) -> int:
    from gateway.lab.cascade_eval import evaluate, fit_all, length_signals
    from gateway.routing.verify import CHECKS

    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip())
    bad = [c for c in checks if c not in CHECKS]
    if bad or not checks:
        print(f"switchyard eval cascade: --checks takes {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    share, above = args.escalate_share, args.escalate_above
    if above is not None:
        share = None
    if (share is not None and not 0 < share < 1) or (above is not None and not 0 < above < 1):
        print(
            "switchyard eval cascade: --escalate-share and --escalate-above take a number in (0, 1)",
            file=sys.stderr,
        )
        return 2
    data = Path(args.data)
    if not data.is_file():
        print(f"switchyard eval cascade: no file at {data}", file=sys.stderr)
        return 1
    if args.other:
        print(json.dumps(length_signals(Path(args.other))))
        return 0
    if args.fit:
        coef = fit_all(data)
        print(json.dumps({"intercept": coef.intercept, "weights": dict(coef.weights)}))
        return 0
    result = evaluate(data, checks, share, above)
    if args.json:
        print(json.dumps(result))
        return 0
    grade = f"escalate_share {share}" if share is not None else f"escalate_above {above}"
    print(f"{result['rows']} prompts; checks {', '.join(checks)}; graded math: {grade}")
    print("| line | quality | vs strong | cost USD | vs strong |\n| --- | ---: | ---: | ---: | ---: |")
    for r in result["table"]:
        cells = (r["line"], r["quality"], r["quality_vs_strong"], r["cost_usd"], r["cost_vs_strong"])
        print("| " + " | ".join(map(str, cells)) + " |")
    print("\n| design | escalated | flags wrong | flags right | AUC |\n| --- | ---: | ---: | ---: | ---: |")
    for name, p in result["power"].items():
        print(f"| {name} | {p['escalated']:.1%} | {p['tpr']:.1%} | {p['fpr']:.1%} | {p['auc']} |")
    for name, t in result["check_ms_per_answer"].items():
        print(f"\ncheck time per answer, {name}: p50 {t['p50']} ms, p99 {t['p99']} ms")
    if "cv_spread" in result:
        q, c = result["cv_spread"]["quality_vs_strong"], result["cv_spread"]["cost_vs_strong"]
        print(
            f"\n2-fold CV over 10 random halvings (min/mean/max): quality vs strong {q}, cost vs strong {c}"
        )
    return 0


def simulate_learned(plan: RoutePlan, policy: Any, tenant: str, task: str | None, url: str) -> dict[str, Any]:
    """The estimates behind a learned route's next choice for (tenant, task), from the ledger."""
    if task is None:
        return {"note": "give --task to see the learned route's estimates for that task"}
    learned = LearnedRoutes()
    if _missing(url) is None:
        store = FeedbackStore(url)
        try:
            learned.load(
                plan,
                store.outcomes(plan.name),
                store.requests_per_task(plan.name),
                abilities(policy),
                store.explored_per_task(plan.name),
            )
        finally:
            store.close()
    estimates, learner = learned.estimates(plan, tenant, task)
    mix = learner.plan().mix.get(learner.name(task), [])
    decision = learned.decide(plan, tenant, task, abilities(policy))
    return {
        "task": task,
        "best_single": learner.plan().best_single,
        "plan": [{"model": m, "share": round(f, 4)} for m, f in mix],
        "next": {"model": decision.choice.model, "decision": decision.label, "why": decision.choice.why},
        "estimates": [
            {
                "model": e.model,
                "mean": round(e.mean, 4),
                "sd": round(e.sd, 4),
                "n": e.n,
                "cost": round(e.cost, 6),
            }
            for e in estimates
        ],
    }


def register(sub: argparse._SubParsersAction[Any]) -> None:
    fb = sub.add_parser("feedback", help="feedback on served requests: import labels, quality reports")
    fsub = fb.add_subparsers(dest="feedback_command", metavar="{import,quality}")
    imp = fsub.add_parser("import", help="store offline labels: JSON lines {request_id, score} or CSV")
    imp.add_argument("file")
    imp.add_argument("--ledger", default=None, help="ledger URL (default: SWITCHYARD_LEDGER)")
    imp.set_defaults(func=cmd_feedback_import)
    qual = fsub.add_parser("quality", help="requests, spend and quality grouped by route/task/model/...")
    qual.add_argument(
        "--by", default="route,task,model", help=f"comma-separated: {', '.join(QUALITY_GROUPS)}"
    )
    for p in (
        qual,
        tasks := sub.add_parser("tasks", help="tasks with requests, spend and quality per model"),
    ):
        p.add_argument("--ledger", default=None, help="ledger URL (default: SWITCHYARD_LEDGER)")
        p.add_argument("--tenant", default=None)
        p.add_argument("--json", action="store_true")
    qual.set_defaults(func=cmd_feedback_quality)
    tasks.set_defaults(func=cmd_tasks)

    def fb_help(_args: argparse.Namespace) -> int:
        fb.print_help()
        return 2

    fb.set_defaults(func=fb_help)


def register_eval(esub: Any) -> None:
    ev = esub.add_parser("routing", help="replay a labelled stream through the learned route's learner")
    ev.add_argument("--stream", required=True, help="JSON lines: task, prompt, scores {model}, costs {model}")
    ev.add_argument("--quality-target", type=float, default=0.95)
    ev.add_argument("--task-floor", type=float, default=0.85)
    ev.add_argument("--seeds", type=int, default=3, help="orderings of the stream averaged")
    ev.add_argument(
        "--half", type=int, choices=[0, 1], default=None, help="only every other task (by SHA-1 of its name)"
    )
    ev.add_argument(
        "--reveal",
        choices=["served", "cheaper", "all"],
        default="served",
        help="a diagnostic: show the learner the outcomes of the models cheaper than the best single"
        " one, or of all, besides the served one (the price of bandit feedback)",
    )
    ev.add_argument(
        "--design",
        default=None,
        help="replay a variant of the rule instead (gateway/lab/learned_designs.py; none ships)",
    )
    ev.add_argument(
        "--per-prompt",
        choices=["difficulty", "classifier"],
        default=None,
        help="also replay with this per-prompt scorer deciding the mixes' draws (paired lines)",
    )
    ev.add_argument(
        "--data",
        action="append",
        default=None,
        help="--per-prompt difficulty: labelled folders to train on, leaving out the stream's "
        "sources (default: ../shared/data/routing-multi and ../shared/data/routing)",
    )
    ev.add_argument("--scorer-weights", default=None, help="--per-prompt: use this weights file instead")
    ev.add_argument(
        "--cache", default=None, help="--per-prompt: directory to cache embeddings in (not the repo)"
    )
    ev.add_argument("--embedder", default="auto", choices=["auto", "onnx", "torch"])
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_eval_routing)
    cas = esub.add_parser("cascade", help="the verifier cascade on answers with labels (gsm8k-dev)")
    cas.add_argument("--data", default="../shared/data/routing/gsm8k-dev.jsonl")
    cas.add_argument("--checks", default="math,refusal", help="comma-separated built-in checks")
    cas.add_argument("--escalate-share", type=float, default=0.4, help="graded math: escalate this share")
    cas.add_argument("--escalate-above", type=float, help="graded math: escalate above this score instead")
    cas.add_argument("--fit", action="store_true", help="print the suspicion coefficients fitted on --data")
    cas.add_argument("--other", help="the routing-multi folder: the length signals' AUCs on its math sets")
    cas.add_argument("--json", action="store_true")
    cas.set_defaults(func=cmd_eval_cascade)
    st = esub.add_parser("routing-stream", help="build a labelled stream from the evaluation data")
    st.add_argument("--source", required=True, choices=["dcrouter", "mmlu-pro"])
    st.add_argument("--data", default="../shared/data/routing-multi", help="the routing-multi folder")
    st.add_argument("--out", required=True)
    st.add_argument(
        "--abilities",
        action="store_true",
        help="each model's accuracy on these rows as its catalog ability (a best case for the prior)",
    )
    st.set_defaults(func=cmd_eval_routing_stream)
