"""Prompt compression: the lossless rewrites (JSON minified, trailing spaces and blank lines,
repeated blocks marked) only in user text and tool outputs; each turn compresses its earlier
turns exactly as the previous request did (the cached prefix does not move), while lossy
trimming does move it; and through a real gateway, for chat, Messages (native to an Anthropic
upstream) and Responses, the upstream gets the compressed text, the response says how many
tokens were saved and the ledger row carries the same count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx

from gateway.protocols.compression import REPEATED, compress, lossless_text
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import mock_policy, start_gateway

PRETTY = json.dumps(
    {"files": [{"name": f"f{i}.py", "lines": i * 10, "ok": True} for i in range(30)]}, indent=4
)
LOG = "line one   \nline two\t\n\n\n\n\nline three\n"


def test_lossless_text() -> None:
    assert lossless_text(PRETTY) == json.dumps(json.loads(PRETTY), separators=(",", ":"))
    assert lossless_text(LOG) == "line one\nline two\n\nline three\n"
    assert lossless_text("{not json   \n") == "{not json\n"
    assert lossless_text("plain") == "plain"


def _chat(turns: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are   \n\n\n\nan agent."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"step {t}   \n"})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{t}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]})  # fmt: skip
        msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": PRETTY})
    return {"model": "m", "messages": msgs}


def test_only_client_and_tool_text_and_the_prefix_stays() -> None:
    before = _chat(3)
    after, changes = compress(before, True, None)
    assert after["messages"][0] == before["messages"][0]  # the system prompt as sent
    assert after["messages"][2] == before["messages"][2]  # the model's own turn as sent
    tools = [m["content"] for m in after["messages"] if m["role"] == "tool"]
    assert tools[0] == lossless_text(PRETTY) and tools[1:] == [REPEATED, REPEATED]  # repeats marked
    assert before["messages"][3]["content"] == PRETTY  # the input is not changed
    assert len(changes) == 6
    # the next turn's compressed messages start with exactly this turn's: the cached prefix holds
    longer, _ = compress(_chat(4), True, None)
    assert longer["messages"][: len(after["messages"])] == after["messages"]
    # lossy trimming rewrites older turns as the conversation advances: the prefix moves
    t3, _ = compress(_chat(3), False, 1)
    t4, _ = compress(_chat(4), False, 1)
    assert t4["messages"][: len(t3["messages"])] != t3["messages"]
    assert (
        "trimmed this older tool output" in t4["messages"][9]["content"]
        and t4["messages"][-1]["content"] == PRETTY
    )


def test_anthropic_and_responses_shapes() -> None:
    messages = {"model": "c", "max_tokens": 5, "system": [{"type": "text", "text": "sys   \n"}], "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": PRETTY},
                                     {"type": "text", "text": LOG}]}]}  # fmt: skip
    out, changes = compress(messages, True, None)
    blocks = out["messages"][0]["content"]
    assert blocks[0]["content"] == lossless_text(PRETTY) and blocks[1]["text"] == lossless_text(LOG)
    assert out["system"] == messages["system"] and len(changes) == 2
    responses = {"model": "r", "input": [{"type": "function_call_output", "call_id": "x", "output": PRETTY},
                                         {"role": "user", "content": [{"type": "input_text", "text": LOG}]}]}  # fmt: skip
    out, changes = compress(responses, True, None)
    assert out["input"][0]["output"] == lossless_text(PRETTY) and len(changes) == 2


def test_through_the_gateway_every_protocol(tmp_path: Path, mock: MockUpstream) -> None:
    policy = mock_policy(mock.base_url).replace(
        "routes:\n", "routes:\n  squeezed:\n    targets: [small]\n    compression: {lossless: true}\n"
        "  squeezed-claude:\n    targets: [claude]\n    compression: {lossless: true}\n", 1)  # fmt: skip
    g = start_gateway(tmp_path, policy)
    try:
        h = g.headers()
        tool = {"role": "tool", "tool_call_id": "c1", "content": PRETTY}
        call = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}  # fmt: skip
        bodies = {
            "/v1/chat/completions": {"model": "squeezed", "messages": [{"role": "user", "content": "go"}, call, tool]},
            "/v1/messages": {"model": "squeezed-claude", "max_tokens": 8, "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": PRETTY}]}]},
            "/v1/responses": {"model": "squeezed", "input": [
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": PRETTY}]},
        }  # fmt: skip
        saved = {}
        with httpx.Client(base_url=g.url, headers=h, timeout=10) as c:
            for path, body in bodies.items():
                mock.state.clear_requests()
                r = c.post(path, json=body)
                assert r.status_code == 200, r.text
                saved[path] = int(r.headers["x-switchyard-compressed-tokens"])
                sent = json.dumps(mock.state.requests()[-1]["body"])
                assert "    " not in sent and lossless_text(PRETTY).replace('"', '\\"') in sent
            r = c.post(
                "/v1/chat/completions",
                json={"model": "small", "messages": [{"role": "user", "content": "x"}]},
            )
            assert "x-switchyard-compressed-tokens" not in r.headers  # off on the route
        assert all(n > 100 for n in saved.values()), saved
        rows = {r["endpoint"]: r["compressed_tokens"] for r in g.ledger_rows() if r["route"] != "small"}
        assert rows == {"chat": saved["/v1/chat/completions"], "messages": saved["/v1/messages"],
                        "responses": saved["/v1/responses"]}  # fmt: skip
    finally:
        g.stop()


def test_a_tool_output_with_a_header_before_its_json() -> None:
    text = "Chunk ID: 1\nWall time: 0.01 s\nProcess exited with code 0\nOutput:\n" + PRETTY
    assert lossless_text(text) == text[: -len(PRETTY)] + json.dumps(json.loads(PRETTY), separators=(",", ":"))
    assert lossless_text("Output:\n{broken\n") == "Output:\n{broken\n"
