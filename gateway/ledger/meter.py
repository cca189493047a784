"""Metering helpers the pipeline calls when it records a request: local usage estimates for
upstreams that report none, and the cause a request's savings are attributed to."""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from gateway.core.types import Target, Usage
from gateway.ledger.tokens import count_completion_tokens, count_prompt_tokens

SEMANTIC_HIT = "semantic_hit"
log = logging.getLogger(__name__)


def estimate_usage(
    body: dict[str, Any], completion: dict[str, Any] | None, model: str, reported: Usage | None = None
) -> Usage:
    """Usage counted with the model's tokenizer (marked estimated): the prompt of ``body`` and
    the output in ``completion`` (a chat/text completion body; None: no output yet). Counts
    the upstream did report (``reported``) are kept as they are."""
    known = reported or Usage()
    input_tokens, output_tokens = known.input_tokens, known.output_tokens
    try:
        if input_tokens is None:
            input_tokens = count_prompt_tokens(body, model)
        if output_tokens is None:
            output_tokens = count_completion_tokens(completion, model) if completion else 0
    except Exception:  # metering must never break a response: the counts stay unknown
        log.exception("local token count failed; the ledger row stays unpriced")
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=known.cached_input_tokens,
        cache_write_tokens=known.cache_write_tokens,
        reasoning_tokens=known.reasoning_tokens,
        estimated=True,
        cache_write_1h_tokens=known.cache_write_1h_tokens,
    )


def savings_cause(
    cache_status: str,
    served: Target | None,
    cost: Decimal | None,
    baseline: Decimal | None,
    baseline_model: str | None = None,
    batch: bool = False,
) -> str:
    """Why this request cost less than its route's baseline model:

    - ``exact_cache`` / ``semantic_cache``: answered from a cache (cache status ``hit`` /
      ``semantic_hit``);
    - ``batch``: a Batch API item the provider's own batch API ran, at its batch price;
    - ``self_hosted``: served by our own engine (a provider with ``self_hosted: true``);
    - ``routing``: served by another model than the baseline (``baseline_model``), cheaper
      for this request;
    - ``none``: anything else (no baseline, unknown cost, not cheaper, or the baseline model
      itself: what it saves is the upstream's own prompt-cache discount).
    """
    if cache_status == "hit":
        return "exact_cache"
    if cache_status == SEMANTIC_HIT:
        return "semantic_cache"
    if served is None or cost is None or baseline is None:
        return "none"
    if batch and cost < baseline:
        return "batch"
    if served.self_hosted:
        return "self_hosted"
    if served.model == baseline_model:
        return "none"
    return "routing" if cost < baseline else "none"
