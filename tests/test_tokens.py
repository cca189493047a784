"""Local token counts: tiktoken with bpe-openai's tables (offline), OpenAI's chat overhead."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.ledger.tokens import (
    count_completion_tokens,
    count_prompt_tokens,
    count_text,
    encoding_name,
    install_encoding_file,
)

REPO = Path(__file__).resolve().parents[1]

# The example of OpenAI's cookbook "How to count tokens with tiktoken": it reports 129 prompt
# tokens for gpt-3.5-turbo / gpt-4 (cl100k_base) and 124 for gpt-4o (o200k_base).
COOKBOOK = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for "
        "increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


def test_openai_cookbook_counts() -> None:
    assert count_prompt_tokens({"messages": COOKBOOK}, "gpt-3.5-turbo") == 129
    assert count_prompt_tokens({"messages": COOKBOOK}, "gpt-4") == 129
    assert count_prompt_tokens({"messages": COOKBOOK}, "gpt-4o") == 124
    assert count_prompt_tokens({"messages": COOKBOOK}, "gpt-4o-mini-2024-07-18") == 124


def test_encoding_per_model() -> None:
    for model in ("gpt-4o", "gpt-4.1-mini", "gpt-5", "o1", "o3-mini", "o4-mini", "openai/gpt-4o"):
        assert encoding_name(model) == "o200k_base", model
    for model in ("gpt-4", "gpt-3.5-turbo", "claude-sonnet-4-5", "meta-llama/Llama-3.1-8B-Instruct", ""):
        assert encoding_name(model) == "cl100k_base", model


def test_message_overhead_by_hand() -> None:
    # "hello world" is 2 tokens and "user" 1 in both encodings: 3 (message) + 1 + 2 + 3 (reply)
    assert count_text("hello world", "gpt-4") == 2
    assert count_prompt_tokens({"messages": [{"role": "user", "content": "hello world"}]}, "gpt-4") == 9
    # a text part list counts like the string
    parts = [{"type": "text", "text": "hello world"}]
    assert count_prompt_tokens({"messages": [{"role": "user", "content": parts}]}, "gpt-4o") == 9
    # an empty conversation still primes the reply
    assert count_prompt_tokens({"messages": []}, "gpt-4o") == 3


def test_tools_and_tool_calls_count() -> None:
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    tools = {**plain, "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]}
    assert count_prompt_tokens(tools, "gpt-4o") > count_prompt_tokens(plain, "gpt-4o")
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
        ],
    }
    assert (
        count_prompt_tokens({"messages": [call]}, "gpt-4o")
        > count_prompt_tokens({"messages": []}, "gpt-4o") + 3
    )


def test_completions_and_embeddings_inputs() -> None:
    assert count_prompt_tokens({"prompt": "hello world"}, "gpt-3.5-turbo-instruct") == 2
    assert count_prompt_tokens({"prompt": ["hello world", "hello"]}, "gpt-3.5-turbo-instruct") == 3
    assert count_prompt_tokens({"input": "hello world"}, "text-embedding-3-small") == 2
    assert count_prompt_tokens({"input": [1, 2, 3, 4]}, "text-embedding-3-small") == 4  # token ids


def test_completion_output_tokens() -> None:
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello world"}},
            {
                "index": 1,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "hello", "arguments": "world"}}],
                },
            },
        ]
    }
    assert count_completion_tokens(body, "gpt-4o") == 4
    assert count_completion_tokens({"choices": [{"text": "hello world"}]}, "gpt-4") == 2
    assert count_completion_tokens({"choices": []}, "gpt-4") == 0


def test_cache_file_is_what_tiktoken_downloads(tmp_path: Path) -> None:
    path = install_encoding_file("cl100k_base", tmp_path)
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    assert path.name == hashlib.sha1(url.encode()).hexdigest()
    sha = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"  # tiktoken's expected hash
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    stamp = path.stat().st_mtime_ns
    assert install_encoding_file("cl100k_base", tmp_path) == path and path.stat().st_mtime_ns == stamp
    path.write_bytes(b"corrupt")
    install_encoding_file("cl100k_base", tmp_path)  # a bad file is replaced
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    with pytest.raises(ValueError):
        install_encoding_file("p50k_base", tmp_path)


def test_fresh_process_offline_under_switchyard_home(tmp_path: Path) -> None:
    """No network: any attempt to open a socket fails the child; the tables land in
    $SWITCHYARD_HOME/tiktoken under tiktoken's names."""
    code = textwrap.dedent(
        """
        import socket, sys
        def refuse(*a, **k):
            raise RuntimeError("network used")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from gateway.ledger.tokens import count_prompt_tokens
        body = {"messages": [{"role": "user", "content": "hello world"}]}
        print(count_prompt_tokens(body, "gpt-4o"), count_prompt_tokens(body, "gpt-4"))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env["SWITCHYARD_HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["9", "9"]
    assert len(list((tmp_path / "home" / "tiktoken").iterdir())) == 2
