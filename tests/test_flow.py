"""Unit tests of the request flow over in-memory ports (tests/flow_fakes.py): metering.record,
the pipeline's chat path, and StreamAssembler.add. The real-server tests cover the same paths
end to end; these pin the bookkeeping one function at a time."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.cache.replay import StreamAssembler, completion_to_chunks
from gateway.core.errors import UpstreamError
from gateway.core.types import Principal, Usage
from gateway.flow import metering, pipeline
from gateway.flow.adapters.chat import Chat
from gateway.flow.exchange import Exchange
from gateway.flow.services import Services
from tests.flow_fakes import FakeLedger, FakeProvider, FakeTracer, services

D = Decimal
HELLO = [{"role": "user", "content": "hi"}]


def exchange(tenant: str = "t") -> Exchange:
    return Exchange("req_1", Principal(tenant, "k1"), time.perf_counter(), time.time())


def ledger_of(svc: Services) -> FakeLedger:
    assert isinstance(svc.ledger, FakeLedger)
    return svc.ledger


def chat(svc: Services, model: str = "r", **body: Any) -> Chat:
    return Chat(svc, {"model": model, "messages": HELLO, **body})


# ----------------------------------------------------------------------------- metering.record
async def test_record_prices_a_served_request_and_settles_its_reservation(tmp_path: Path) -> None:
    svc = services(tmp_path)
    ex = exchange()
    ex.plan = svc.router.plan("r", ex.principal, "chat")
    ex.target = ex.plan.targets[0]
    cand = svc.limits.candidate(svc.policy, "r", "chat", ex.plan.policy, ex.plan.targets)
    _, ex.reservation = await svc.limits.reserve(svc.policy, "t", "k1", {"messages": HELLO}, [cand])
    assert ex.reservation is not None
    ex.usage = Usage(input_tokens=1000, output_tokens=500)
    metering.record(svc, ex)
    (row,) = ledger_of(svc).rows
    assert row.cost_usd == D("0.002")  # 1000 x $1/M + 500 x $2/M
    assert row.baseline_cost_usd == D("0.025")  # the same tokens on the baseline model
    assert row.savings_cause == "routing" and row.status == "ok" and row.served_model == "small"
    assert ex.reservation is None  # handed back to the limits exactly once
    (budget,) = [r for r in await svc.limits.status(svc.policy) if r["scope"] == "tenant"]
    assert D(budget["spent_usd"]) == D("0.002")  # settled to the real cost, not the worst case
    assert isinstance(svc.tracer, FakeTracer) and svc.tracer.facts[0].cost == D("0.002")
    assert await metering.durable(ex, "reply") == "reply" and ex.commit is None


async def test_record_charges_what_the_ledger_carries_on_error_and_releases_on_a_cache_hit(
    tmp_path: Path,
) -> None:
    svc = services(tmp_path)
    for status, cache in (("error", "miss"), ("ok", "hit")):
        ex = exchange()
        ex.plan = svc.router.plan("r", ex.principal, "chat")
        ex.target = ex.plan.targets[0] if status == "error" else None
        cand = svc.limits.candidate(svc.policy, "r", "chat", ex.plan.policy, ex.plan.targets)
        _, ex.reservation = await svc.limits.reserve(svc.policy, "t", None, {"messages": HELLO}, [cand])
        ex.status, ex.cache = status, cache
        ex.usage = Usage(input_tokens=10, output_tokens=5)
        metering.record(svc, ex)
    error, hit = ledger_of(svc).rows
    assert error.status == "error" and error.cost_usd == D("0.00002")
    assert hit.cost_usd == D(0) and hit.savings_cause == "exact_cache" and hit.served_model is None
    (budget,) = [r for r in await svc.limits.status(svc.policy) if r["scope"] == "tenant"]
    # the failed request had usage (the upstream billed it): the budget is charged what its
    # ledger row carries, so budgets and ledger agree; the hit's reservation is released
    assert D(budget["spent_usd"]) == error.cost_usd


async def test_record_runs_once_and_keeps_unknown_counts_unknown(tmp_path: Path) -> None:
    svc = services(tmp_path)
    ex = exchange()
    ex.plan = svc.router.plan("r", ex.principal, "chat")
    ex.target = ex.plan.targets[0]
    ex.usage = Usage(input_tokens=None, output_tokens=7)
    metering.record(svc, ex)
    metering.record(svc, ex)
    (row,) = ledger_of(svc).rows
    assert row.input_tokens is None and row.output_tokens == 7


# ----------------------------------------------------------------------------- pipeline.serve (chat)
async def test_chat_calls_the_provider_then_answers_from_the_exact_cache(tmp_path: Path) -> None:
    provider = FakeProvider(text="pong")
    svc = services(tmp_path, providers={"up": provider})
    first = await pipeline.serve(svc, chat(svc), exchange())
    await svc.tasks.aclose()  # the cache write runs in the background
    second = await pipeline.serve(svc, chat(svc), exchange())
    assert first.body is not None and orjson.loads(first.body)["choices"][0]["message"]["content"] == "pong"
    assert second.body == first.body and second.headers["x-switchyard-cache"] == "hit"
    assert len(provider.calls) == 1
    assert [r.cache_status for r in ledger_of(svc).rows] == ["miss", "hit"]


async def test_chat_stream_relays_chunks_and_meters_before_done(tmp_path: Path) -> None:
    svc = services(tmp_path, providers={"up": FakeProvider(text="abc")})
    reply = await pipeline.serve(svc, chat(svc, stream=True), exchange())
    assert reply.stream is not None
    frames = [f async for f in reply.stream]
    assert frames[-1] == b"data: [DONE]\n\n"
    text = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in (orjson.loads(f[6:]) for f in frames[:-1])
        if c["choices"]
    )
    assert text == "abc"
    (row,) = ledger_of(svc).rows
    assert row.stream and row.status == "ok" and row.output_tokens == 500 and row.ttft_ms is not None


async def test_chat_upstream_failure_leaves_an_error_row(tmp_path: Path) -> None:
    class Failing(FakeProvider):
        async def chat(self, body: dict[str, Any], target: Any, timeout: float) -> Any:
            raise UpstreamError("boom", upstream_status=500, retryable=False)

    svc = services(tmp_path, providers={"up": Failing()})
    with pytest.raises(UpstreamError):
        await pipeline.serve(svc, chat(svc), exchange())
    (row,) = ledger_of(svc).rows
    assert row.status == "error" and row.http_status == 502 and row.attempts == 1


# ----------------------------------------------------------------------------- StreamAssembler.add
def _chunk(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": list(choices),
        **extra,
    }


def test_assembler_joins_content_tool_calls_and_choices() -> None:
    asm = StreamAssembler()
    asm.add(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
    asm.add(_chunk({"index": 0, "delta": {"content": "Hel"}}, {"index": 1, "delta": {"content": "B"}}))
    asm.add(_chunk({"index": 0, "delta": {"content": "lo"}}))
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_", "arguments": '{"ci'}}
    asm.add(_chunk({"index": 1, "delta": {"tool_calls": [call]}}))
    more = {"index": 0, "function": {"name": "weather", "arguments": 'ty": "Oslo"}'}}
    asm.add(_chunk({"index": 1, "delta": {"tool_calls": [more]}}))
    asm.add(_chunk({"index": 0, "delta": {}, "finish_reason": "stop"}))
    asm.add(_chunk({"index": 1, "delta": {}, "finish_reason": "tool_calls"}))
    asm.add(_chunk(usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}))
    out = asm.completion()
    first, second = out["choices"]
    assert first["message"]["content"] == "Hello" and first["finish_reason"] == "stop"
    fn = second["message"]["tool_calls"][0]["function"]
    assert fn == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert second["message"]["tool_calls"][0]["id"] == "call_1" and second["finish_reason"] == "tool_calls"
    assert out["usage"]["total_tokens"] == 7 and out["id"] == "c1" and out["created"] == 7
    assert asm.content_chars == len("Hello") + len("B") + len('{"city": "Oslo"}')


def test_assembler_round_trips_a_cached_completion() -> None:
    completion = {
        "id": "x",
        "object": "chat.completion",
        "created": 3,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    asm = StreamAssembler()
    for chunk in completion_to_chunks(completion, include_usage=True):
        asm.add(chunk)
    assert asm.completion() == completion


def test_assembler_keeps_a_refusal_and_ignores_empty_chunks() -> None:
    asm = StreamAssembler()
    asm.add(_chunk())
    asm.add(_chunk({"index": 0, "delta": {"refusal": "I can't"}}))
    asm.add(_chunk({"index": 0, "delta": {"refusal": " help."}, "finish_reason": "stop"}))
    (choice,) = asm.completion()["choices"]
    assert choice["message"]["refusal"] == "I can't help." and choice["message"]["content"] is None
