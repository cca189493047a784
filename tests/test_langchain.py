"""LangChain through Switchyard: ``ChatOpenAI`` (chat completions) and ``ChatAnthropic``
(Anthropic Messages) pointed at the gateway, a plain call, a stream and a tool call each."""

from __future__ import annotations

from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.gateway_harness import RunningGateway


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "42"


def models(gw: RunningGateway) -> list[Any]:
    key = gw.key()
    return [
        ChatOpenAI(base_url=gw.base_url, api_key=key, model="auto", max_retries=0),  # type: ignore[arg-type]
        ChatAnthropic(base_url=gw.url, api_key=key, model="claude", max_tokens=64, max_retries=0),  # type: ignore[call-arg,arg-type]
    ]


def test_invoke_stream_and_tools_through_the_gateway(gateway: RunningGateway) -> None:
    for llm in models(gateway):
        answer = llm.invoke("hello there")
        assert isinstance(answer.content, str) and answer.content
        streamed = "".join(str(chunk.content) for chunk in llm.stream("hello again"))
        assert streamed
        called = llm.bind_tools([lookup]).invoke("use the lookup tool")
        assert called.tool_calls and called.tool_calls[0]["name"] == "lookup"
    endpoints = [r["endpoint"] for r in gateway.ledger_rows()]
    assert endpoints.count("chat") == 3 and endpoints.count("messages") == 3
