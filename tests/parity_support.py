"""The pieces of tests/test_parity.py: one request in each inbound protocol (the same prompt as
chat, legacy completions, Anthropic Messages and OpenAI Responses spell it, as raw JSON), a
reader of each protocol's SSE stream that says how it ended, the answer's text and error of
each protocol, and the policy every cell of the matrix runs on."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2 as httpx
import pytest

from tests.gateway_harness import RunningGateway, mock_policy

Protocol = Literal["chat", "completions", "messages", "responses"]
PROTOCOLS: tuple[Protocol, ...] = ("chat", "completions", "messages", "responses")
PATHS: dict[Protocol, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
# every protocol x stream cell, and the streamed ones alone
CELLS = [pytest.param(p, s, id=f"{p}-{'stream' if s else 'json'}") for p in PROTOCOLS for s in (False, True)]
STREAM_CELLS = [pytest.param(p, True, id=f"{p}-stream") for p in PROTOCOLS]

# --------------------------------------------------------------------------- the policy
BUDGET_USD = "0.003"  # per budget tenant and day: 3,000 tokens at `metered`'s 1 USD per 1M
MODELS = """\
  metered: {provider: mock, upstream: mock-metered, price: {input: 1, output: 1}}
  primary: {provider: mock, upstream: mock-primary, price: {input: 0.15, output: 0.60}}
  backup: {provider: mock, upstream: mock-backup, price: {input: 0.15, output: 0.60}}
  slow: {provider: mock, upstream: mock-slow, price: {input: 0.15, output: 0.60}}
  cutter: {provider: mock, upstream: mock-cut, price: {input: 0.15, output: 0.60}}
"""
DEADLINE_S = 0.5
ROUTES = f"""\
  plain:
    targets: [small]
  squeezed:
    targets: [small]
    cache: {{mode: "off"}}
    compression: {{lossless: true}}
  budgeted:
    targets: [metered]
    cache: {{mode: "off"}}
  tiered:
    tiers: {{cheap: [small], strong: [large]}}
    classifier: {{threshold: 0.5}}
    baseline: large
    cache: {{mode: "off"}}
  faq:
    targets: [small]
    semantic_cache: {{enabled: true, ttl_s: 600, threshold: 0.9}}
  failover:
    targets: [primary, backup]
    retries: 0
    cache: {{mode: "off"}}
  deadline:
    targets: [slow]
    retries: 0
    attempt_timeout_s: 10
    stream_idle_timeout_s: 10
    deadline_s: {DEADLINE_S}
    cache: {{mode: "off"}}
  cut:
    targets: [cutter]
    retries: 0
    cache: {{mode: "off"}}
"""


def _insert(text: str, anchor: str, added: str) -> str:
    assert anchor in text, f"mock_policy() no longer has {anchor!r}"
    return text.replace(anchor, anchor + added, 1)


def budget_tenant(protocol: Protocol, stream: bool) -> str:
    return f"budget-{protocol}-{'stream' if stream else 'json'}"


def parity_policy(mock_url: str) -> str:
    """mock_policy (its `code` route pins temperature 0.1 and top_p 0.2) plus one route per
    promise, one budget tenant per cell, and a breaker that never opens (the fallback cells
    fail `primary` once each, on purpose)."""
    tenants = "".join(
        f"  {budget_tenant(p, s)}:\n    budget: {{daily_usd: {BUDGET_USD}}}\n"
        for p in PROTOCOLS
        for s in (False, True)
    )
    text = mock_policy(mock_url)
    text = _insert(text, "\nmodels:\n", MODELS)
    text = _insert(text, "\nroutes:\n", ROUTES)
    text = _insert(text, "\ntenants:\n", tenants)
    assert "failure_threshold: 3" in text
    return text.replace("failure_threshold: 3", "failure_threshold: 100000", 1)


# --------------------------------------------------------------------------- requests
Turn = tuple[Literal["user", "assistant"], str]


@dataclass(frozen=True)
class Ask:
    """One prompt, protocol-neutral: an optional system prompt, earlier turns, the user's
    message, the output bound and sampling parameters (spelt alike by every protocol)."""

    user: str
    system: str | None = None
    history: tuple[Turn, ...] = ()
    max_tokens: int = 16
    params: Mapping[str, Any] = field(default_factory=dict)
    # a legacy completion is one prompt: it can name its conversation only explicitly
    conversation: str | None = None


def request(protocol: Protocol, model: str, ask: Ask, stream: bool) -> dict[str, Any]:
    """The request body ``ask`` is in ``protocol``."""
    turns = [*ask.history, ("user", ask.user)]
    if protocol == "chat":
        system = [{"role": "system", "content": ask.system}] if ask.system else []
        messages = system + [{"role": r, "content": t} for r, t in turns]
        return {
            "model": model,
            "messages": messages,
            "max_tokens": ask.max_tokens,
            "stream": stream,
            **ask.params,
        }
    if protocol == "completions":
        texts = ([ask.system] if ask.system else []) + [t for _, t in turns]
        body = {"model": model, "prompt": "\n\n".join(texts), "max_tokens": ask.max_tokens, "stream": stream}
        if ask.conversation is not None:
            body["prompt_cache_key"] = ask.conversation
        return {**body, **ask.params}
    if protocol == "messages":
        body = {
            "model": model,
            "max_tokens": ask.max_tokens,
            "messages": [{"role": r, "content": t} for r, t in turns],
            "stream": stream,
        }
        if ask.system:
            body["system"] = ask.system
        return {**body, **ask.params}
    body = {
        "model": model,
        "input": ask.user if not ask.history else [{"role": r, "content": t} for r, t in turns],
        "max_output_tokens": ask.max_tokens,
        "stream": stream,
    }
    if ask.system:
        body["instructions"] = ask.system
    return {**body, **ask.params}


TOOL = {
    "name": "Bash",
    "description": "Run a shell command in the repository and return its output.",
    "schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command line"}},
        "required": ["command"],
    },
}
CALL_ID = "toolu_01parity"
ARGS = {"command": "pytest -q"}


def agent_request(
    protocol: Protocol, model: str, system: list[str], tool_output: str, user: str, stream: bool
) -> dict[str, Any]:
    """A coding agent's turn (what Claude Code sends on Messages): a system prompt in blocks,
    a tool with its schema, the assistant's tool call and the tool's result, then the user's
    message, spelt by ``protocol``. A legacy completion carries the same text as its prompt."""
    opening, said = "Run the test suite.", "Running it."
    if protocol == "messages":
        blocks: list[dict[str, Any]] = [{"type": "text", "text": s} for s in system]
        blocks[-1]["cache_control"] = {"type": "ephemeral"}
        tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]
        use = {"type": "tool_use", "id": CALL_ID, "name": TOOL["name"], "input": ARGS}
        result = {
            "type": "tool_result",
            "tool_use_id": CALL_ID,
            "content": [{"type": "text", "text": tool_output}],
        }
        messages = [
            {"role": "user", "content": [{"type": "text", "text": opening}]},
            {"role": "assistant", "content": [{"type": "text", "text": said}, use]},
            {"role": "user", "content": [result, {"type": "text", "text": user}]},
        ]
        return {
            "model": model,
            "max_tokens": 16,
            "system": blocks,
            "tools": tools,
            "messages": messages,
            "stream": stream,
        }
    instructions = "\n\n".join(system)
    fn = {"name": TOOL["name"], "description": TOOL["description"], "parameters": TOOL["schema"]}
    if protocol == "chat":
        call = {
            "id": CALL_ID,
            "type": "function",
            "function": {"name": TOOL["name"], "arguments": json.dumps(ARGS)},
        }
        messages = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": opening},
            {"role": "assistant", "content": said, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": tool_output},
            {"role": "user", "content": user},
        ]
        tools = [{"type": "function", "function": fn}]
        return {"model": model, "messages": messages, "tools": tools, "max_tokens": 16, "stream": stream}
    if protocol == "responses":
        items = [
            {"role": "user", "content": opening},
            {"role": "assistant", "content": said},
            {
                "type": "function_call",
                "call_id": CALL_ID,
                "name": TOOL["name"],
                "arguments": json.dumps(ARGS),
            },
            {"type": "function_call_output", "call_id": CALL_ID, "output": tool_output},
            {"role": "user", "content": user},
        ]
        tools = [{"type": "function", **fn}]
        return {
            "model": model,
            "instructions": instructions,
            "input": items,
            "tools": tools,
            "max_output_tokens": 16,
            "stream": stream,
        }
    prompt = "\n\n".join([instructions, opening, said, tool_output, user])
    return {"model": model, "prompt": prompt, "max_tokens": 16, "stream": stream}


def send(
    gw: RunningGateway, protocol: Protocol, body: dict[str, Any], tenant: str = "team-a"
) -> httpx.Response:
    return gw.post(PATHS[protocol], body, tenant=tenant)


# --------------------------------------------------------------------------- answers
@dataclass(frozen=True)
class Event:
    name: str | None  # the `event:` line (Messages, Responses); None on chat and completions
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def sse_events(text: str) -> list[Event]:
    """The events of a whole SSE body, in order."""
    out: list[Event] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].removeprefix(" "))
        if data:
            out.append(Event(name, "\n".join(data)))
    return out


Ending = Literal["clean", "error", "unfinished", "contradictory"]


def stream_end(protocol: Protocol, events: list[Event]) -> Ending:
    """How a streamed answer ended: ``clean`` (the protocol's end, no error event), ``error``
    (an error event, no clean end), ``unfinished`` (neither) or ``contradictory`` (both)."""
    clean = error = False
    if protocol in ("chat", "completions"):
        for e in events:
            if e.data == "[DONE]":
                clean = e is events[-1]
            elif isinstance(e.json(), dict) and "error" in e.json():
                error = True
    elif protocol == "messages":
        kinds = [e.name or e.json().get("type") for e in events]
        error = "error" in kinds
        clean = bool(kinds) and kinds[-1] == "message_stop"
    else:
        kinds = [e.name or e.json().get("type") for e in events]
        error = "error" in kinds or "response.failed" in kinds
        clean = bool(kinds) and kinds[-1] in ("response.completed", "response.incomplete")
    if clean and error:
        return "contradictory"
    return "clean" if clean else "error" if error else "unfinished"


def answer_text(protocol: Protocol, r: httpx.Response) -> str:
    """The answer's text, from a JSON answer or a whole streamed one."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        body = r.json()
        if protocol == "chat":
            return str(body["choices"][0]["message"]["content"] or "")
        if protocol == "completions":
            return str(body["choices"][0]["text"])
        if protocol == "messages":
            return "".join(b["text"] for b in body["content"] if b["type"] == "text")
        return "".join(
            p["text"]
            for item in body["output"]
            if item["type"] == "message"
            for p in item["content"]
            if p["type"] == "output_text"
        )
    parts: list[str] = []
    for e in sse_events(r.text):
        if e.data == "[DONE]":
            continue
        data = e.json()
        if protocol == "chat":
            parts += [c["delta"].get("content") or "" for c in data.get("choices") or ()]
        elif protocol == "completions":
            parts += [c.get("text") or "" for c in data.get("choices") or ()]
        elif protocol == "messages" and data.get("type") == "content_block_delta":
            parts.append(data["delta"].get("text") or "")
        elif protocol == "responses" and data.get("type") == "response.output_text.delta":
            parts.append(data["delta"])
    return "".join(parts)


def error_of(protocol: Protocol, r: httpx.Response) -> tuple[str, str]:
    """(code, message) of an error answer; Messages errors carry a type, not a code."""
    err = r.json()["error"]
    if protocol == "messages":
        assert r.json()["type"] == "error", r.text
        return str(err["type"]), str(err["message"])
    return str(err["code"]), str(err["message"])


def ledger_row(gw: RunningGateway, r: httpx.Response) -> dict[str, Any]:
    """The ledger row of the request ``r`` answered (by its x-request-id)."""
    rid = r.headers["x-request-id"]
    rows = [row for row in gw.ledger_rows() if row["request_id"] == rid]
    assert len(rows) == 1, f"request {rid}: {len(rows)} ledger rows"
    return rows[0]
