"""The OpenAI Agents SDK (PyPI ``openai-agents``) running agent turns through the gateway's
``/v1/responses``: a plain turn, and a tool-using turn (function call, the tool run by the
SDK, its output sent back, the final answer), with ledger rows for each model call."""

from __future__ import annotations

from decimal import Decimal

from tests.conftest import require_module
from tests.gateway_harness import RunningGateway

agents = require_module("agents")
openai = require_module("openai")


async def test_agent_turn_with_a_tool(gateway: RunningGateway) -> None:
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key(), max_retries=0)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(q: str) -> str:  # the mock calls a tool with {"q": <the user's text>}
        """The weather for a question."""
        calls.append(q)
        return "sunny, 21C"

    model = agents.OpenAIResponsesModel(model="small", openai_client=client)
    plain = agents.Agent(name="plain", instructions="Be brief.", model=model)
    result = await agents.Runner.run(plain, "hello")
    assert isinstance(result.final_output, str) and result.final_output

    helper = agents.Agent(name="weather", instructions="Use tools.", model=model, tools=[get_weather])
    result = await agents.Runner.run(helper, "weather in Paris?")
    assert calls == ["weather in Paris?"] and result.final_output
    await client.close()
    rows = gateway.ledger_rows()
    assert [(r["endpoint"], r["status"]) for r in rows] == [("responses", "ok")] * 3
    assert all(Decimal(str(r["cost_usd"])) > 0 for r in rows)
