"""A route whose providers have no API key is the operator's configuration, not a passing
fault: a 500 ``provider_not_configured`` with ``x-should-retry: false``, which the official
openai and anthropic SDKs obey (they retry 408, 409, 429 and every 5xx otherwise). Counted on
the gateway's own ledger: one request, one row, however many retries the client allows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2 as httpx
import openai
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

NO_KEY = """
  keyless:
    type: openai
    base_url: {url}/v1
    api_key: ${{KEYLESS_API_KEY:-}}
"""


@pytest.fixture
def gw(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    text = mock_policy(mock.base_url).replace(
        "providers:\n", "providers:\n" + NO_KEY.format(url=mock.base_url).lstrip("\n"), 1
    )
    text = text.replace(
        "models:\n", "models:\n  orphan: {provider: keyless, upstream: x, price: {input: 1, output: 1}}\n", 1
    )
    text = text.replace("breaker:\n", 'aliases:\n  "orph*": orphan\n  "vec-*": embed\nbreaker:\n', 1)
    gateway = start_gateway(tmp_path, text)
    try:
        yield gateway
    finally:
        gateway.stop()


def test_raw_answer(gw: RunningGateway, mock: MockUpstream) -> None:
    r = gw.post("/v1/chat/completions", {"model": "orphan", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false"
    err = r.json()["error"]
    assert err["code"] == "provider_not_configured" and err["type"] == "server_error"
    assert "no API key" in err["message"] and "orphan" in err["message"]
    assert mock.requests() == []


def test_openai_sdk_does_not_retry(gw: RunningGateway, mock: MockUpstream) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=4, timeout=30)
    with client, pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="orphan", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 500 and info.value.code == "provider_not_configured"
    rows = gw.ledger_rows()
    assert [(r["http_status"], r["error_code"]) for r in rows] == [(500, "provider_not_configured")]
    assert rows[0]["route"] == "orphan"  # `spend --by route` shows which route is misconfigured
    assert mock.requests() == []


def test_anthropic_sdk_does_not_retry(gw: RunningGateway, mock: MockUpstream) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=gw.key(), max_retries=4)
    with client, pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model="orphan", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 500
    rows = gw.ledger_rows()
    assert len(rows) == 1 and rows[0]["route"] == "orphan" and mock.requests() == []


def test_a_passing_fault_is_still_retried_by_the_sdk(gw: RunningGateway, mock: MockUpstream) -> None:
    """The control: an overload-style 5xx without the header is retried as before."""
    mock.add_fault("status", model="mock-small", status=503, times=20)
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=1, timeout=30)
    with client, pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}])
    assert len(gw.ledger_rows()) == 2  # the SDK tried twice


@pytest.mark.parametrize(
    ("model", "owner"),
    [("orphan", "keyless"), ("orphan-2", "switchyard"), ("vec-large", "switchyard"), ("auto", "switchyard")],
)
def test_models_retrieve_resolves_models_routes_and_aliases(
    gw: RunningGateway, model: str, owner: str
) -> None:
    """An alias of an embeddings model, or of a model whose provider has no key, exists too."""
    with openai.OpenAI(base_url=gw.base_url, api_key=gw.key(), max_retries=0) as client:
        found = client.models.retrieve(model)
    assert found.id == model and found.owned_by == owner and found.object == "model"


def test_models_retrieve_unknown_is_an_openai_404(gw: RunningGateway) -> None:
    r = httpx.get(gw.base_url + "/models/nope-1", headers=gw.headers())
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model 'nope-1' does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
