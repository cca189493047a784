"""The labelled data of the difficulty model (`switchyard train router --irt`): every file of
``../shared/data/routing-multi`` and ``../shared/data/routing`` as one sparse prompt x model
table of outcomes in [0, 1].

- ``mmlu-pro.jsonl``: ``correct`` {model: bool}; task = ``category``;
- ``dcrouter.jsonl``: ``score`` {model: float} (partial credit kept); task = ``task``;
- ``alpaca-eval.jsonl``: ``pref`` {model: 1..2}; outcome = pref - 1 (the model's win
  probability against the reference); task = ``dataset``;
- routing-style files (``weak_correct``/``strong_correct``): the two models of RouteLLM's
  evals (Mixtral-8x7B-Instruct, GPT-4-1106-preview); task = the file and ``domain``.

A model is keyed by ``source/name``: an ability is only comparable within the judge and the
scale of one source."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
ROUTING_WEAK = "mixtral-8x7b-instruct"
ROUTING_STRONG = "gpt-4-1106-preview"


@dataclass(frozen=True, slots=True)
class Table:
    prompts: list[str]
    source: list[str]  # the file stem of each prompt
    task: list[str]  # source/task of each prompt (the unit a cross-task split holds out)
    models: list[str]  # "source/name"
    rows: I64  # one entry per observed (prompt, model) outcome
    cols: I64
    y: F64  # outcome in [0, 1]
    out_chars: F64  # length of the model's answer (chars), NaN when unknown


def _outcomes(row: dict[str, Any], stem: str) -> tuple[dict[str, float], dict[str, float], str]:
    """(model -> outcome, model -> answer chars, task) of one row."""
    chars = {k: float(v) for k, v in (row.get("output_chars") or {}).items()}
    if "pref" in row:
        return {k: float(v) - 1.0 for k, v in row["pref"].items()}, chars, str(row.get("dataset", ""))
    if "score" in row:
        return {k: float(v) for k, v in row["score"].items()}, chars, str(row.get("task", ""))
    if "correct" in row:
        return {k: float(bool(v)) for k, v in row["correct"].items()}, chars, str(row.get("category", ""))
    if "weak_correct" in row:
        out = {
            ROUTING_WEAK: float(bool(row["weak_correct"])),
            ROUTING_STRONG: float(bool(row["strong_correct"])),
        }
        for key, name in (("weak_response", ROUTING_WEAK), ("strong_response", ROUTING_STRONG)):
            if isinstance(row.get(key), str):
                chars[name] = float(len(row[key]))
        return out, chars, str(row.get("domain") or stem)
    raise ValueError("a row needs one of pref, score, correct or weak_correct/strong_correct")


def read_table(files: list[Path]) -> Table:
    prompts: list[str] = []
    source: list[str] = []
    task: list[str] = []
    model_ix: dict[str, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    ys: list[float] = []
    chars: list[float] = []
    for path in files:
        stem = path.stem
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                outcome, out_chars, t = _outcomes(row, stem)
                text = str(row["prompt"])
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{i}: {exc}") from None
            p = len(prompts)
            prompts.append(text)
            source.append(stem)
            task.append(f"{stem}/{t}")
            for name, y in sorted(outcome.items()):
                key = f"{stem}/{name}"
                m = model_ix.setdefault(key, len(model_ix))
                rows.append(p)
                cols.append(m)
                ys.append(min(1.0, max(0.0, y)))
                chars.append(out_chars.get(name, float("nan")))
    if len(prompts) < 50:
        raise ValueError(f"only {len(prompts)} labelled prompts; need at least 50 to train")
    return Table(
        prompts, source, task, list(model_ix), np.array(rows, dtype=np.int64),
        np.array(cols, dtype=np.int64), np.array(ys), np.array(chars),
    )  # fmt: skip


def encode_by_file(table: Table, encode: Any) -> Any:
    """The embeddings of every prompt, encoded one file at a time (so an embedding cache keyed
    on a file's prompts is reused by every command)."""
    stems = list(dict.fromkeys(table.source))
    parts = [
        encode([p for p, s in zip(table.prompts, table.source, strict=True) if s == stem]) for stem in stems
    ]
    return np.concatenate(parts)


def dense(table: Table) -> F64:
    """(prompts, models) outcome matrix, NaN where a model has no label for a prompt."""
    out = np.full((len(table.prompts), len(table.models)), np.nan)
    out[table.rows, table.cols] = table.y
    return out


def dense_chars(table: Table) -> F64:
    out = np.full((len(table.prompts), len(table.models)), np.nan)
    out[table.rows, table.cols] = table.out_chars
    return out
