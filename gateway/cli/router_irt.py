"""The difficulty model's commands (called from gateway.cli.router):

switchyard train router --irt --data DIR_OR_FILES... [--out PATH]
switchyard train router --prompt-difficulty --data DIR_OR_FILES... [--out PATH]
switchyard eval router --multi DIR_OR_FILES... [--families irt,mirt,...] [--json]
switchyard router score --input P.jsonl --output S.jsonl --models a,b   (per-model success)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def fit_and_write(out: str, fit: Callable[[], dict[str, Any]]) -> int:
    """Run a training ``fit`` and write the weights it returns to ``out`` (a ValueError is the
    data's fault: exit 2 with its message)."""
    try:
        doc = fit()
    except ValueError as exc:
        return _fail(str(exc))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def train(args: argparse.Namespace, files: list[Path], embedders: list[Any]) -> int:
    from gateway.lab.batch_embed import cached_encode
    from gateway.lab.irt_train import train_difficulty

    command = "switchyard train router --irt " + " ".join(
        [*(f"--data {d}" for d in args.data), f"--out {args.out}"]
        + ([f"--seed {args.seed}"] if args.seed else [])
    )
    return fit_and_write(
        args.out,
        lambda: train_difficulty(
            files,
            lambda texts: cached_encode(texts, embedders, Path(args.cache) if args.cache else None),
            embedder_name=embedders[0].name,
            seed=args.seed,
            command=command,
            log=lambda m: print(m, file=sys.stderr),
        ),
    )


def train_prompt(args: argparse.Namespace, files: list[Path], embedders: list[Any]) -> int:
    """`switchyard train router --prompt-difficulty`: the ``router score --scorer difficulty`` weights."""
    from gateway.lab.batch_embed import cached_encode
    from gateway.lab.prompt_difficulty_train import train_prompt_difficulty

    command = "switchyard train router --prompt-difficulty " + " ".join(
        [*(f"--data {d}" for d in args.data), f"--out {args.out}"]
    )
    return fit_and_write(
        args.out,
        lambda: train_prompt_difficulty(
            files,
            lambda texts: cached_encode(texts, embedders, Path(args.cache) if args.cache else None),
            embedder_name=embedders[0].name,
            command=command,
            log=lambda m: print(m, file=sys.stderr),
        ),
    )


def check_families(spec: str) -> tuple[str, ...]:
    """The families of ``--families`` (comma-separated); ValueError names an unknown one."""
    from gateway.lab.difficulty_designs import DESIGNS
    from gateway.lab.irt_fit import FAMILIES

    families = tuple(f for f in spec.split(",") if f)
    for fam in families:
        base, _, plus = fam.partition("+")
        if base not in (*FAMILIES, *DESIGNS) or plus not in ("", "len", "lenfit"):
            raise ValueError(
                f"unknown family {fam!r}; known: {', '.join((*FAMILIES, *DESIGNS))}, "
                "each optionally with +len or +lenfit"
            )
    if not families:
        raise ValueError("--families names no family")
    return families


def evaluate_multi(args: argparse.Namespace, files: list[Path], embedders: list[Any]) -> int:
    """The cross-task tables: every family beside random, prompt length and the oracle."""

    from gateway.lab.batch_embed import cached_encode
    from gateway.lab.irt_data import encode_by_file, read_table
    from gateway.lab.irt_eval import pair_table, report, summary_table
    from gateway.routing.features import feature_matrix

    try:
        families = check_families(args.families)
        table = read_table(files)
    except ValueError as exc:
        return _fail(str(exc))
    cache = Path(args.cache) if args.cache else None
    emb = encode_by_file(table, lambda texts: cached_encode(texts, embedders, cache))
    prices = _prices(files)
    rep = report(table, emb, feature_matrix(table.prompts), prices, seed=0, families=families)
    if args.json:
        print(json.dumps(rep))
        return 0
    for split, rows in rep.items():
        print(f"### {split}\n\n{summary_table(rows)}\n")
        print(
            pair_table(rows, (*families, "prompt-length", "random", "oracle", "ceiling", "ceiling+len"))
            + "\n"
        )
    return 0


def _prices(files: list[Path]) -> dict[str, Any]:
    """Per source: model -> {input_price, output_price} from a models.json beside the files."""
    for f in files:
        meta = f.parent / "models.json"
        if meta.is_file():
            doc = json.loads(meta.read_text(encoding="utf-8"))
            return {
                src: {m: v for m, v in info.get("models", {}).items() if "input_price" in v}
                for src, info in doc.items()
            }
    return {}


def model_success(
    model_names: list[str], weights: str | None, emb: Any, texts: list[str]
) -> list[dict[str, float]]:
    """Per row: model -> predicted success, from the difficulty model's abilities."""
    from gateway.routing.quality import DifficultyModel

    dm = DifficultyModel.load(Path(weights) if weights else None)
    abilities = {}
    for name in model_names:
        a = dm.ability(name)
        if a is None:
            known = sorted({k.split("/", 1)[1] for k in dm.abilities})
            raise ValueError(f"no ability for model {name!r}; known: {', '.join(known)}")
        abilities[name] = a
    d = dm.difficulty_batch(emb, texts)
    return [{m: round(dm.success(float(x), a), 6) for m, a in abilities.items()} for x in d]


def simulate_quality(auto: Any, body: dict[str, Any], backend: str) -> dict[str, Any]:
    """`policy simulate` of a ``select: cheapest`` route: every candidate's ability and price;
    with a user message in ``--body``, each one's predicted quality and cost, and the choice."""
    from gateway.cache.semantic_key import last_user_text

    out: dict[str, Any] = {
        "select": "cheapest",
        "quality_target": auto.quality_target,
        "candidates": [
            {
                "model": c.model,
                "ability": round(c.ability, 4),
                "price_in_out": [c.input_price, c.output_price],
            }
            for c in auto.candidates
        ],
    }
    text = last_user_text(body)
    if not text:
        out["note"] = "give --body with a user message to see the predictions and the choice"
        return out
    from gateway.cache.embedder import load_embedder

    emb = load_embedder(backend)
    auto.model.check_embedder(emb.name, emb.dim)
    plan, chosen, d, preds = auto.decide(emb.encode([text])[0], text)
    out["difficulty"] = round(d, 4)
    out["predictions"] = [
        {"model": p.model, "quality": round(p.quality, 4), "expected_cost_usd": float(f"{p.cost:.6g}")}
        for p in preds
    ]
    out["chosen"] = chosen
    out["order"] = [t.model for t in plan.targets]
    return out
