"""Labelled streams for ``switchyard eval routing`` built from the evaluation data
(``../shared/data/routing-multi``), one JSON line per prompt: task, prompt, per-model score and
cost (list price x tokens; tokens = characters / 4), after a first line with each model's
blended list price (the catalog prior the learner starts from).

Sources:
  dcrouter   9 open models (7B-70B) at LLMRouter's prices, its tasks (the "dcrouter-like mix");
             output length is not in the data: 256 output tokens for every model
  mmlu-pro   eleven API and open models at public list prices (USD per 1M input/output
             tokens, late 2024, ``API_PRICES``), per category; output from ``output_chars``
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

DCROUTER_OUTPUT_TOKENS: Final = 256
# Public list prices, USD per 1M tokens (input, output), as sold by the vendor named.
API_PRICES: Final[dict[str, tuple[float, float]]] = {
    "gemini-1.5-pro-002": (1.25, 5.00),  # Google AI, <= 128k context
    "gemini-1.5-flash-002": (0.075, 0.30),  # Google AI, <= 128k context
    "DeepSeek-Coder-V2": (0.14, 0.28),  # DeepSeek API
    "jamba-1.5-large": (2.00, 8.00),  # AI21
    "c4ai-command-r-v01": (0.15, 0.60),  # Cohere command-r (08-2024 price)
    "Meta-Llama-3_1-70B-Instruct": (0.88, 0.88),  # Together turbo
    "Meta-Llama-3_1-8B-Instruct": (0.18, 0.18),  # Together turbo
    "Qwen1.5-72B-Chat": (0.90, 0.90),  # Together
    "Mixtral-8x7B-Instruct-v0.1": (0.60, 0.60),  # Together
    "Phi-3-mini-4k-instruct": (0.13, 0.52),  # Azure AI
    "Mistral-7B-Instruct-v0.2": (0.20, 0.20),  # Together
}


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                yield orjson.loads(line)


def _tokens(chars: int) -> int:
    return max(1, chars // 4)


def dcrouter(data: Path) -> Iterator[dict[str, Any]]:
    meta = orjson.loads((data / "models.json").read_bytes())["dcrouter"]["models"]
    prices = {m: (float(v["input_price"]), float(v["output_price"])) for m, v in meta.items()}
    yield {"models": {m: {"price": (i + o) / 2} for m, (i, o) in prices.items()}}
    for row in _rows(data / "dcrouter.jsonl"):
        if "|" in row["task"]:
            continue
        tin = _tokens(len(row["prompt"]))
        costs = {m: (tin * i + DCROUTER_OUTPUT_TOKENS * o) / 1e6 for m, (i, o) in prices.items()}
        scores = {m: float(row["score"][m]) for m in prices}
        yield {"task": row["task"], "prompt": row["prompt"], "scores": scores, "costs": costs}


def mmlu_pro(data: Path) -> Iterator[dict[str, Any]]:
    yield {"models": {m: {"price": (i + o) / 2} for m, (i, o) in API_PRICES.items()}}
    for row in _rows(data / "mmlu-pro.jsonl"):
        if not all(m in row["correct"] and m in row["output_chars"] for m in API_PRICES):
            continue
        tin = _tokens(len(row["prompt"]))
        costs = {m: (tin * i + _tokens(row["output_chars"][m]) * o) / 1e6 for m, (i, o) in API_PRICES.items()}
        scores = {m: 1.0 if row["correct"][m] else 0.0 for m in API_PRICES}
        yield {"task": row["category"], "prompt": row["prompt"], "scores": scores, "costs": costs}


SOURCES: Final = {"dcrouter": dcrouter, "mmlu-pro": mmlu_pro}


def write(source: str, data: Path, out: Path, abilities: bool = False) -> int:
    """Write the stream of ``source`` from ``data`` (the routing-multi folder) to ``out``;
    returns the rows written (the models line excluded). ``abilities``: give each model its
    accuracy on the source's rows (``models.json``) as the catalog prior: a best case for a
    catalog ability, since it is measured on the very rows replayed."""
    accuracy = orjson.loads((data / "models.json").read_bytes())[source]["models"] if abilities else {}
    n = -1
    with out.open("wb") as fh:
        for obj in SOURCES[source](data):
            if n < 0 and accuracy:
                for m, meta in obj["models"].items():
                    if "accuracy" in accuracy.get(m, {}):
                        meta["ability"] = float(accuracy[m]["accuracy"])
            fh.write(orjson.dumps(obj) + b"\n")
            n += 1
    return n
