"""The compression step (docs/compression.md): the route's ``compression`` policy applied to
the request's wire body (gateway/protocols/compression.py), then the record translated again
from it, so the record's body (chat upstreams, caches, counting) and the wire body (a native
pass-through) carry the same compressed text. The tokens saved (by the tokenizer the ledger
estimates with) go on the exchange: the ledger's ``compressed_tokens`` and the
``x-switchyard-compressed-tokens`` header."""

from __future__ import annotations

from gateway.core.request import RequestRecord
from gateway.flow.adapters.base import Inbound
from gateway.flow.exchange import Exchange
from gateway.ledger.tokens import count_text
from gateway.protocols.compression import compress
from gateway.routing.plan import RoutePlan


def step(inbound: Inbound, plan: RoutePlan, ex: Exchange) -> RequestRecord:
    """Compress the request when its route asks; the (possibly new) record."""
    policy = plan.policy.compression
    if not policy.lossless and policy.trim_tool_outputs_after is None:
        return inbound.record
    body, changes = compress(inbound.wire, policy.lossless, policy.trim_tool_outputs_after)
    ex.compressed_tokens = 0
    if not changes:
        return inbound.record
    model = plan.targets[0].upstream_model if plan.targets else ""
    ex.compressed_tokens = sum(
        count_text(before, model) - count_text(after, model) for before, after in changes
    )
    inbound.wire = body
    inbound.retranslate()
    return inbound.record
