"""schemathesis against the gateway's own OpenAPI document, for every /v1/* operation: valid
bodies (from the declared request schemas) and invalid ones, through a real gateway in front
of the mock upstream. No 5xx other than the documented upstream ones, no undocumented status,
no response that violates the declared schema, never a traceback. Examples are bounded so the
whole file runs in well under two minutes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, mock_policy, start_gateway

EXAMPLES = 30
# Routes the generated `model` field can reach: the fuzzer picks strings, so most requests are
# 404s; a share of them is steered to real routes/models so the upstream path is fuzzed too.
REAL_MODELS = {
    "chat": "auto",
    "completions": "legacy",
    "embeddings": "embed",
    "responses": "auto",
    "messages": "anthropic-first",  # passed through to the Anthropic mock
    "count_tokens": "anthropic-first",
}
UPSTREAM_REFUSAL = re.compile(r"upstream '[^']+' rejected the request")


@pytest.fixture(scope="module")
def fuzz_mock() -> Iterator[MockUpstream]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=4) as mock:
        yield mock


@pytest.fixture(scope="module")
def fuzz_gateway(
    tmp_path_factory: pytest.TempPathFactory, fuzz_mock: MockUpstream
) -> Iterator[RunningGateway]:
    extra = "server:\n  max_body_bytes: 1048576\n"
    policy = mock_policy(fuzz_mock.base_url, extra).replace("rpm: 5", "rpm: 100000")
    gw = start_gateway(tmp_path_factory.mktemp("fuzz"), policy)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def api(fuzz_gateway: RunningGateway) -> Any:
    return schemathesis.openapi.from_url(fuzz_gateway.url + "/openapi.json")


def strict_number_refusal(value: Any) -> bool:
    """An integral float (5.0) or an integer outside 64 bits anywhere in the body."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, int) and not isinstance(value, bool):
        return not -(2**63) <= value < 2**64
    if isinstance(value, dict):
        return any(strict_number_refusal(v) for v in value.values())
    if isinstance(value, list):
        return any(strict_number_refusal(v) for v in value)
    return False


def refusal_code(payload: dict[str, Any]) -> str | None:
    """The error code of a refusal in its protocol's shape: OpenAI's ``error.code``; Anthropic's
    shape (``{"type": "error", "error": {"type", "message"}}``) has no code, so an upstream's
    refusal is told by the gateway's message, anything else by the error type."""
    error = payload["error"]
    if payload.get("type") == "error":
        assert set(error) == {"type", "message"}, payload
        return "upstream_rejected" if UPSTREAM_REFUSAL.match(error["message"]) else str(error["type"])
    return error["code"]


def assert_acceptable_refusal(body: Any, payload: dict[str, Any]) -> None:
    """Schema-valid bodies the gateway may still refuse with 400: JSON Schema's "integer"
    admits 5.0, which the gateway (like OpenAI) refuses for integer fields, and integers of any
    size, while JSON numbers past 64 bits are refused; and the upstream's own refusals (passed
    through as upstream_rejected); and on /v1/completions over a chat route, what has no chat
    equivalent (echo, logprobs, suffix, best_of > 1, token prompts: unsupported_parameter)."""
    code = refusal_code(payload)
    legacy = isinstance(body, dict) and "prompt" in body and code == "unsupported_parameter"
    assert strict_number_refusal(body) or code == "upstream_rejected" or legacy, (payload, body)


def v1_operations(api: Any) -> list[Any]:
    ops = [r.ok() for r in api.get_all_operations()]
    return [op for op in ops if op.path.startswith("/v1/")]


def test_every_v1_operation_documents_its_body(api: Any) -> None:
    ops = {(op.method.upper(), op.path): op for op in v1_operations(api)}
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings")} <= set(
        ops
    )
    for key, op in ops.items():
        if key[0] == "POST":
            assert op.body, f"{key}: no request body schema in /openapi.json"


FUZZED_POSTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
)


@pytest.mark.parametrize(
    ("path", "mode"),
    [(path, mode) for path in FUZZED_POSTS for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    + [("/v1/models", GenerationMode.POSITIVE)],  # a GET: no request body for negative cases to break
)
def test_fuzz(
    api: Any, fuzz_gateway: RunningGateway, fuzz_mock: MockUpstream, path: str, mode: GenerationMode
) -> None:
    ops = [op for op in v1_operations(api) if op.path == path]
    assert ops, path
    op = ops[0]
    headers = fuzz_gateway.headers()
    kind = path.rsplit("/", 1)[-1]
    real = REAL_MODELS.get("chat" if kind == "completions" and "chat" in path else kind)
    seen: dict[int, int] = {}
    calls = [0]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same examples on every run (CI must not flake)
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        calls[0] += 1
        steer = real and mode is GenerationMode.POSITIVE and calls[0] % 2 == 0
        if steer and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = real  # half the cases reach the upstream
        response = case.call(headers=headers, timeout=30)
        status = response.status_code
        seen[status] = seen.get(status, 0) + 1
        assert "Traceback" not in response.text
        assert status < 500, f"{status}: {response.text[:500]}"  # the mock upstream is healthy
        if mode is GenerationMode.POSITIVE and status == 400:
            assert_acceptable_refusal(case.body, response.json())
        # schema conformance of status, content type, headers and body (JSON and SSE); the two
        # checks replaced by the assertions above are excluded
        case.validate_response(
            response, headers=headers, excluded_checks=[positive_data_acceptance, not_a_server_error]
        )

    if path == "/v1/messages" and mode is GenerationMode.POSITIVE:
        # a few upstream refusals, passed through in Anthropic's shape (no code): the refusal
        # check must read that shape too
        fuzz_mock.add_fault(kind="status", status=400, model="claude-mock", times=3)
    try:
        run()
    finally:
        fuzz_mock.clear_faults()
    print(path, mode.value, dict(sorted(seen.items())))
    assert sum(seen.values()) >= 1
