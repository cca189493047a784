"""The per-prompt scores of a stream's prompts for `switchyard eval routing --per-prompt`, never
from a model trained on those prompts:

- ``difficulty``: the prompt-difficulty design (``ridge-x+lenfit``, the shipped scorer's,
  lab/prompt_difficulty_train.py) retrained on the labelled files that hold none of the
  stream's prompts (every file that holds one is left out: its source), or the weights given;
- ``classifier``: the shipped complexity classifier (routing/classifier.py), trained on the
  files its weights name.

Either way the report says how many of the stream's prompts the scorer's training files hold
(0 for an honest line). Also the scorer's time per prompt, one prompt at a time as a request
would pay it: embedding plus score."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache.embedder import Embedder
from gateway.lab.batch_embed import cached_encode
from gateway.lab.irt_fit import F32
from gateway.routing.classifier import ComplexityClassifier
from gateway.routing.prompt_difficulty import PromptDifficulty

SCORERS = ("difficulty", "classifier")
TIMED = 200  # prompts timed one by one

ScoreBatch = Callable[[F32, list[str]], Any]


@dataclass(frozen=True, slots=True)
class Scored:
    scores: dict[str, float]  # prompt text -> score
    trained_on: list[str]  # the training files' names
    left_out: list[str]  # files left out because they hold the stream's prompts
    seen: int  # the stream's distinct prompts found in the training files
    ms_p50: float
    ms_p99: float


def labelled_files(data: Sequence[Path]) -> list[Path]:
    return [f for d in data for f in sorted(d.glob("*.jsonl"))]


def file_prompts(path: Path) -> set[str]:
    with path.open(encoding="utf-8") as fh:
        return {str(json.loads(line)["prompt"]) for line in fh if line.strip()}


def time_scorer(embedder: Embedder, score: ScoreBatch, texts: Sequence[str]) -> tuple[float, float]:
    """(p50, p99) ms of embedding + scoring one prompt at a time (texts the embedder's LRU has
    not seen, so each is encoded)."""
    ms = []
    for text in texts:
        t0 = time.perf_counter()
        score(embedder.encode([text]), [text])
        ms.append(1000 * (time.perf_counter() - t0))
    ms.sort()
    return round(statistics.median(ms), 2), round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2)


def score_stream(
    kind: str, prompts: Sequence[str], data: Sequence[Path], embedder: Embedder, cache: Path | None,
    weights: Path | None = None, log: Callable[[str], None] = print,
) -> Scored:  # fmt: skip
    """Score every distinct prompt of a stream with the ``kind`` scorer (see the module)."""
    texts = list(dict.fromkeys(prompts))
    files = labelled_files(data)
    left_out: list[str] = []
    scorer: PromptDifficulty | ComplexityClassifier
    if kind == "difficulty" and weights is None:
        from gateway.lab.prompt_difficulty_train import train_prompt_difficulty

        wanted = set(texts)
        keep = [f for f in files if not (file_prompts(f) & wanted)]
        left_out = [f.name for f in files if f not in keep]
        log(f"training the difficulty design on {', '.join(f.name for f in keep)} (left out: {left_out})")
        doc = train_prompt_difficulty(
            keep,
            lambda t: cached_encode(t, [embedder], cache),
            embedder_name=embedder.name,
            command="switchyard eval routing --per-prompt difficulty",
            log=log,
        )
        scorer = PromptDifficulty(doc, "leave-source-out")
        trained = [f.name for f in keep]
    elif kind == "difficulty":
        scorer = PromptDifficulty.load(weights)
        trained = [f["name"] for f in training_files(weights)]
    elif kind == "classifier":
        scorer = ComplexityClassifier.load(weights)
        trained = [f["name"] for f in training_files(weights, classifier=True)]
    else:
        raise ValueError(f"unknown scorer {kind!r}; known: {', '.join(SCORERS)}")
    scorer.check_embedder(embedder.name, embedder.dim)
    batch: ScoreBatch = scorer.scores if isinstance(scorer, PromptDifficulty) else scorer.score_batch
    p50, p99 = time_scorer(embedder, batch, texts[:TIMED])
    log(f"embedding {len(texts)} prompts ...")
    emb = cached_encode(texts, [embedder], cache)
    values = np.asarray(batch(emb, texts), dtype=np.float64)
    by_name = {f.name: f for f in files}
    seen = set().union(*(file_prompts(by_name[n]) for n in trained if n in by_name)) & set(texts)
    return Scored(dict(zip(texts, values.tolist(), strict=True)), trained, left_out, len(seen), p50, p99)


def training_files(weights: Path | None, classifier: bool = False) -> list[dict[str, Any]]:
    """The training files a weights file names (its ``training.files``)."""
    from gateway.routing.classifier import SHIPPED_WEIGHTS
    from gateway.routing.prompt_difficulty import SHIPPED_PROMPT_DIFFICULTY

    path = weights or (SHIPPED_WEIGHTS if classifier else SHIPPED_PROMPT_DIFFICULTY)
    doc = json.loads(path.read_text(encoding="utf-8"))
    return list(doc.get("training", {}).get("files", []))
