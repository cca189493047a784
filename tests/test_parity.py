"""The parity matrix: every promise the gateway makes holds for every inbound protocol (OpenAI
chat, legacy completions over a chat route, Anthropic Messages, OpenAI Responses), streamed
and not. One test per promise, one cell per protocol x stream, through a real gateway on
loopback against the mock upstream; every assertion reads the body the mock upstream received
or the request's ledger row. The chat-shaped mock targets make all four protocols reach the
same upstream, so the same prompt must meet the same fate whichever protocol carried it."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, start_gateway
from tests.parity_support import (
    BUDGET_USD,
    CELLS,
    DEADLINE_S,
    STREAM_CELLS,
    Ask,
    Protocol,
    Turn,
    agent_request,
    answer_text,
    budget_tenant,
    error_of,
    ledger_row,
    parity_policy,
    request,
    send,
    sse_events,
    stream_end,
)

REPLY_WORDS = 8  # the mock's answer length: its usage reports one token a word
SYSTEM = "You are a careful assistant. Answer in one short paragraph."
MILLION = Decimal(1_000_000)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def upstream() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=REPLY_WORDS) as m:
        yield m


@pytest.fixture(scope="module")
def embedder_missing(shared_model_dir: Path) -> str | None:
    """None when the embedder loads (its int8 export made once per session, in the session's
    model folder), else why it cannot: the semantic cache and the classifier need it."""
    try:
        from gateway.cache.embed_backends import ModelUnavailable
        from gateway.cache.embedder import load_embedder
    except ImportError as exc:  # the ml extra is not installed
        return f"the embedder cannot be imported: {exc}"
    try:
        emb = load_embedder("auto", model_dir=shared_model_dir)
    except ModelUnavailable as exc:
        return f"the embedder model is unavailable: {exc}"
    emb.close()
    return None


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
    upstream: MockUpstream,
    shared_model_dir: Path,
    embedder_missing: str | None,
) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("parity")
    if embedder_missing is None:
        from gateway.cache.embed_backends import onnx_path

        export = onnx_path(shared_model_dir, shared_model_dir)
        if export.exists():  # the gateway's own models folder gets it: no second export
            models = tmp / "home" / "models"
            models.mkdir(parents=True)
            try:
                os.link(export, models / export.name)
            except OSError:
                shutil.copyfile(export, models / export.name)
    gateway = start_gateway(tmp, parity_policy(upstream.base_url))
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(upstream: MockUpstream) -> Iterator[None]:
    upstream.reset()
    upstream.configure(ttft_ms=0, itl_ms=0, tokens=REPLY_WORDS)
    yield
    upstream.clear_faults()
    upstream.configure(ttft_ms=0, itl_ms=0, tokens=REPLY_WORDS)


def marker(protocol: Protocol, stream: bool) -> str:
    """A word unique to one request (its cache key, conversation and upstream body)."""
    return f"{protocol}{'S' if stream else 'J'}{uuid.uuid4().hex[:10]}"


def sent_upstream(upstream: MockUpstream, mark: str) -> list[dict[str, Any]]:
    """The bodies the mock upstream received that carry ``mark``, oldest first."""
    return [
        r["body"]
        for r in upstream.requests()
        if isinstance(r["body"], dict) and mark in orjson.dumps(r["body"]).decode()
    ]


def assert_served(protocol: Protocol, r: httpx.Response, stream: bool) -> None:
    """A 200 with an answer; a stream that ended clean."""
    assert r.status_code == 200, r.text
    if stream:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert stream_end(protocol, sse_events(r.text)) == "clean", r.text
    assert answer_text(protocol, r), r.text


# --------------------------------------------------------------------------- 1. params
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_pinned_params_override_the_client(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    mark = marker(protocol, stream)
    ask = Ask(f"Tidy this function {mark}", SYSTEM, params={"temperature": 0.9, "top_p": 0.9})
    r = send(gw, protocol, request(protocol, "code", ask, stream))
    assert_served(protocol, r, stream)
    (body,) = sent_upstream(upstream, mark)
    assert (body["temperature"], body["top_p"]) == (0.1, 0.2), "the route pins temperature 0.1, top_p 0.2"


# --------------------------------------------------------------------------- 2. budgets
# A coding agent's prompt: ~2,300 tokens of system prompt and ~1,800 of tool output. The budget
# (3,000 tokens at 1 USD per 1M) refuses it only when both are counted, and admits a short prompt.
SYSTEM_BLOCKS = [
    " ".join(
        f"Rule {i}.{j}: keep the build green, write the test before the fix, and never commit secrets."
        for j in range(25)
    )
    for i in range(4)
]
TOOL_OUTPUT = "\n".join(
    f"tests/test_module_{i}.py::test_case_{i} FAILED - AssertionError: expected {i} got {i + 1}"
    for i in range(80)
)
BUDGET_TOKENS = int(Decimal(BUDGET_USD) * MILLION)  # `metered` costs 1 USD per 1M tokens


def test_the_budget_prompt_is_refused_only_if_system_and_tool_results_count() -> None:
    """The premise of the budget cells: neither the system prompt nor the tool output alone
    overruns the budget, together they do by a wide margin."""
    from gateway.ledger.tokens import count_text

    system = sum(count_text(s, "mock-metered") for s in SYSTEM_BLOCKS)
    tool = count_text(TOOL_OUTPUT, "mock-metered")
    assert system < 0.8 * BUDGET_TOKENS and tool < 0.8 * BUDGET_TOKENS, (system, tool)
    assert system + tool > 1.25 * BUDGET_TOKENS, (system, tool)


@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_budget_counts_system_prompt_and_tool_results(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    tenant = budget_tenant(protocol, stream)  # a budget of its own: cells never share spend
    mark = marker(protocol, stream)
    big = agent_request(protocol, "budgeted", SYSTEM_BLOCKS, TOOL_OUTPUT, f"Why did it fail? {mark}", stream)
    r = send(gw, protocol, big, tenant)
    assert r.status_code == 429, f"a ~4,100-token prompt on a 3,000-token budget was answered {r.status_code}"
    code, message = error_of(protocol, r)
    assert code == ("rate_limit_error" if protocol == "messages" else "budget_exceeded"), r.text
    assert f"daily budget of {BUDGET_USD} USD for tenant '{tenant}'" in message, message
    row = ledger_row(gw, r)
    assert (row["status"], row["http_status"], row["error_code"]) == ("error", 429, "budget_exceeded")
    assert not sent_upstream(upstream, mark), "a refused request never reaches the upstream"

    small = marker(protocol, stream)
    r = send(gw, protocol, request(protocol, "budgeted", Ask(f"Say hi {small}", "Be brief."), stream), tenant)
    assert_served(protocol, r, stream)
    assert ledger_row(gw, r)["status"] == "ok"
    assert len(sent_upstream(upstream, small)) == 1


# --------------------------------------------------------------------------- 2b. compression
PADDED_OUTPUT = "".join(f"tests/test_module_{i}.py ....   \n\n\n\n" for i in range(30)) + "120 passed   \n"


@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_compression_reaches_the_upstream_and_the_ledger(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    mark = marker(protocol, stream)
    body = agent_request(protocol, "squeezed", SYSTEM_BLOCKS[:1], PADDED_OUTPUT, f"Summarise {mark}", stream)
    r = send(gw, protocol, body)
    assert r.status_code == 200, r.text  # the mock answers with a call of the agent's tool
    (sent,) = sent_upstream(upstream, mark)
    text = orjson.dumps(sent).decode()
    assert "120 passed" in text and "   \\n" not in text and "\\n\\n\\n" not in text, (
        "the tool output was compressed"
    )
    saved = int(r.headers["x-switchyard-compressed-tokens"])
    assert saved > 0 and ledger_row(gw, r)["compressed_tokens"] == saved


# --------------------------------------------------------------------------- 3. classifier
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_classifier_scores_the_request(
    gw: RunningGateway, embedder_missing: str | None, protocol: Protocol, stream: bool
) -> None:
    if embedder_missing:
        pytest.skip(embedder_missing)
    mark = marker(protocol, stream)
    ask = Ask(f"Prove that there are infinitely many primes of the form 4k+3. ({mark})", SYSTEM)
    r = send(gw, protocol, request(protocol, "tiered", ask, stream))
    assert_served(protocol, r, stream)
    row = ledger_row(gw, r)
    assert row["classifier_score"] is not None, f"no classifier score on {protocol}: {row['route_decision']=}"
    assert 0.0 <= row["classifier_score"] <= 1.0
    assert row["route_decision"] in ("cheap", "strong")
    tier_model = {"cheap": "small", "strong": "large"}[row["route_decision"]]
    assert row["served_model"] == r.headers["x-switchyard-model"] == tier_model


# --------------------------------------------------------------------------- 4. exact cache
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_exact_cache_hit_on_repeat(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    mark = marker(protocol, stream)
    body = request(
        protocol,
        "plain",
        Ask(f"Name the capital of France. {mark}", SYSTEM, params={"temperature": 0}),
        stream,
    )
    first, second = send(gw, protocol, body), send(gw, protocol, body)
    assert_served(protocol, first, stream)
    assert_served(protocol, second, stream)
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "hit"
    assert answer_text(protocol, second) == answer_text(protocol, first)
    row = ledger_row(gw, second)
    assert row["cache_status"] == "hit" and Decimal(row["cost_usd"]) == 0, row
    assert len(sent_upstream(upstream, mark)) == 1, "the repeat never reaches the upstream"


# --------------------------------------------------------------------------- 5. semantic cache
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_semantic_hit_on_a_paraphrase(
    gw: RunningGateway, upstream: MockUpstream, embedder_missing: str | None, protocol: Protocol, stream: bool
) -> None:
    if embedder_missing:
        pytest.skip(embedder_missing)
    tenant = f"semantic-{protocol}-{'stream' if stream else 'json'}"  # a cache of its own
    params = {"temperature": 0}
    first = send(
        gw,
        protocol,
        request(protocol, "faq", Ask("How can I reset my password?", SYSTEM, params=params), stream),
        tenant,
    )
    second = send(
        gw,
        protocol,
        request(protocol, "faq", Ask("How do I reset my password?", SYSTEM, params=params), stream),
        tenant,
    )
    assert_served(protocol, first, stream)
    assert_served(protocol, second, stream)
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "semantic"
    assert answer_text(protocol, second) == answer_text(protocol, first)
    row = ledger_row(gw, second)
    assert row["cache_status"] == "semantic_hit" and Decimal(row["cost_usd"]) == 0, row
    assert len(sent_upstream(upstream, "reset my password")) == 1


# --------------------------------------------------------------------------- 6. sticky model
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_a_conversation_keeps_its_fallback_model(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    """The first turn's first target fails with a 500, the fallback serves it; the next turn of
    the same conversation (same system prompt and first user turn; a legacy completion, one
    prompt, names its conversation with prompt_cache_key) goes to the fallback first."""
    mark = marker(protocol, stream)
    upstream.add_fault("status", model="mock-primary", status=500)
    turn1 = Ask(f"Fix the failing test {mark}.", SYSTEM, conversation=mark)
    first = send(gw, protocol, request(protocol, "failover", turn1, stream))
    assert_served(protocol, first, stream)
    assert first.headers["x-switchyard-model"] == "backup"
    history: tuple[Turn, ...] = (("user", turn1.user), ("assistant", answer_text(protocol, first)))
    turn2 = Ask("Thanks. Now run it again.", SYSTEM, history=history, conversation=mark)
    second = send(gw, protocol, request(protocol, "failover", turn2, stream))
    assert_served(protocol, second, stream)
    assert second.headers["x-switchyard-model"] == "backup", "the conversation moved back to primary"
    assert [b["model"] for b in sent_upstream(upstream, mark)] == [
        "mock-primary",
        "mock-backup",
        "mock-backup",
    ]
    row = ledger_row(gw, second)
    assert (row["served_model"], row["route_decision"], row["attempts"]) == ("backup", "sticky", 1)


# --------------------------------------------------------------------------- 7. fallback
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_fallback_on_a_5xx(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    mark = marker(protocol, stream)
    upstream.add_fault("status", model="mock-primary", status=500)
    r = send(gw, protocol, request(protocol, "failover", Ask(f"Hello {mark}", SYSTEM), stream))
    assert_served(protocol, r, stream)
    assert r.headers["x-switchyard-model"] == "backup"
    assert [b["model"] for b in sent_upstream(upstream, mark)] == ["mock-primary", "mock-backup"]
    row = ledger_row(gw, r)
    assert (row["status"], row["served_model"], row["attempts"]) == ("ok", "backup", 2), row


# --------------------------------------------------------------------------- 8. deadline
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_deadline_ends_a_slow_request_with_an_error(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    """The upstream takes 0.4 s a token (2.8 s for its answer); the route's deadline is 0.5 s.
    A JSON answer is a 504; a stream already under way ends with an error event."""
    upstream.configure(itl_ms=400)
    mark = marker(protocol, stream)
    t0 = time.perf_counter()
    r = send(gw, protocol, request(protocol, "deadline", Ask(f"Take your time {mark}", SYSTEM), stream))
    elapsed = time.perf_counter() - t0
    assert elapsed < DEADLINE_S + 1.2, f"deadline {DEADLINE_S}s, the request took {elapsed:.2f}s"
    row = ledger_row(gw, r)
    assert row["error_code"] == "upstream_timeout", row
    if stream:
        assert r.status_code == 200, r.text
        assert stream_end(protocol, sse_events(r.text)) == "error", r.text
        assert row["status"] in ("error", "stream_broken"), row
    else:
        assert r.status_code == 504, r.text
        code, _ = error_of(protocol, r)
        assert code == ("timeout_error" if protocol == "messages" else "upstream_timeout"), r.text
        assert (row["status"], row["http_status"]) == ("error", 504), row


@pytest.mark.parametrize(("protocol", "stream"), STREAM_CELLS)
def test_deadline_cuts_a_stalled_stream(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    """The upstream sends a few chunks, then holds its connection silent for 3 s (well inside
    the idle timeout); the 0.5 s deadline still ends the stream then, with an error event."""
    mark = marker(protocol, stream)
    upstream.add_fault("stall_mid_stream", model="mock-slow", after_chunks=2, seconds=3.0)
    t0 = time.perf_counter()
    r = send(gw, protocol, request(protocol, "deadline", Ask(f"Hold on {mark}", SYSTEM), stream))
    elapsed = time.perf_counter() - t0
    assert elapsed < DEADLINE_S + 1.2, f"deadline {DEADLINE_S}s, the stalled stream took {elapsed:.2f}s"
    assert r.status_code == 200 and stream_end(protocol, sse_events(r.text)) == "error", r.text
    row = ledger_row(gw, r)
    assert row["error_code"] == "upstream_timeout" and row["status"] == "stream_broken", row


# --------------------------------------------------------------------------- 9. cut stream
@pytest.mark.parametrize(("protocol", "stream"), STREAM_CELLS)
def test_a_cut_stream_ends_in_an_error(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    mark = marker(protocol, stream)
    upstream.add_fault("cut_mid_stream", model="mock-cut", after_chunks=3)
    r = send(gw, protocol, request(protocol, "cut", Ask(f"Tell me a story {mark}", SYSTEM), stream))
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert stream_end(protocol, events) == "error", r.text
    if protocol in ("chat", "completions"):
        assert "[DONE]" not in [e.data for e in events]
        assert events[-1].json()["error"]["code"] == "stream_interrupted", r.text
    elif protocol == "messages":
        assert events[-1].name == "error" and "message_stop" not in [e.name for e in events], r.text
    else:
        kinds = [e.name for e in events]
        assert kinds[-1] in ("error", "response.failed") and "response.completed" not in kinds, r.text
    assert len(sent_upstream(upstream, mark)) == 1, "no silent retry once bytes went out"
    row = ledger_row(gw, r)
    assert (row["status"], row["error_code"]) == ("stream_broken", "stream_interrupted"), row


# --------------------------------------------------------------------------- 10. cost
@pytest.mark.parametrize(("protocol", "stream"), CELLS)
def test_equal_usage_costs_the_same(
    gw: RunningGateway, upstream: MockUpstream, protocol: Protocol, stream: bool
) -> None:
    """The same prompt (no system prompt: a legacy completion has none) on `small` (0.15 / 0.60
    USD per 1M): the mock reports one token a word, so every cell's row is the same."""
    mark = marker(protocol, stream)
    ask = Ask(f"Summarise the release notes {mark}")
    r = send(gw, protocol, request(protocol, "plain", ask, stream))
    assert_served(protocol, r, stream)
    (body,) = sent_upstream(upstream, mark)
    assert [m["role"] for m in body["messages"]] == ["user"], body
    words = len(ask.user.split())
    row = ledger_row(gw, r)
    assert row["endpoint"] == protocol and row["stream"] == int(stream)
    got = (row["input_tokens"], row["output_tokens"], row["cached_tokens"] or 0, row["usage_estimated"])
    assert got == (words, REPLY_WORDS, 0, 0), row
    cost = (Decimal(words) * Decimal("0.15") + Decimal(REPLY_WORDS) * Decimal("0.60")) / MILLION
    assert Decimal(row["cost_usd"]) == cost.quantize(Decimal("1E-10")), row


# --------------------------------------------------------------------------- the task
def test_the_same_system_prompt_is_the_same_task(gw: RunningGateway, upstream: MockUpstream) -> None:
    """A request's task (the ledger's ``task``, what feedback and learned routes group by) is
    the fingerprint of its system prompt: the same whatever protocol carried it (a legacy
    completion has no system prompt, so it has the empty prompt's task)."""
    tasks: dict[tuple[str, bool], str] = {}
    for cell in CELLS:
        protocol, stream = cell.values
        mark = marker(protocol, stream)
        system = None if protocol == "completions" else SYSTEM
        r = send(gw, protocol, request(protocol, "plain", Ask(f"Summarise the notes {mark}", system), stream))
        assert_served(protocol, r, stream)
        tasks[(protocol, stream)] = ledger_row(gw, r)["task"]
    with_system = {t for (p, _), t in tasks.items() if p != "completions"}
    without = {t for (p, _), t in tasks.items() if p == "completions"}
    assert len(with_system) == 1 and len(without) == 1 and with_system != without, tasks
    assert next(iter(with_system)).startswith("sys:")
