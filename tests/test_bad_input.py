"""Bad input gets a clear OpenAI-shaped error with the right status and changes nothing:
no upstream call, no successful ledger row, no traceback in any body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway, mock_policy, start_gateway

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
OK_BODY = {"model": "auto", "messages": HELLO}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def assert_error(
    r: httpx.Response, status: int, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The response is ``status`` with an OpenAI error body; returns the ``error`` object."""
    assert "Traceback" not in r.text
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert list(body) == ["error"], body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and len(err["message"]) > 10
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def assert_untouched(gateway: RunningGateway, mock: MockUpstream) -> None:
    assert mock.requests() == [], "the upstream was called"
    assert [r for r in gateway.ledger_rows() if r["status"] == "ok"] == []


# --------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "auto", "messages": [',
        b"{'model': 'auto'}",
        b'{"model": "auto",}',
        b"NaN",
    ],
    ids=["truncated", "single-quotes", "trailing-comma", "nan"],
)
def test_malformed_json(gateway: RunningGateway, mock: MockUpstream, raw: bytes) -> None:
    r = gateway.post(CHAT, raw, headers={"content-type": "application/json"})
    err = assert_error(r, 400)
    assert "JSON" in err["message"]
    assert_untouched(gateway, mock)


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"hello"', b"null", b"42", b"true"])
def test_json_that_is_not_an_object(gateway: RunningGateway, mock: MockUpstream, raw: bytes) -> None:
    err = assert_error(gateway.post(CHAT, raw, headers={"content-type": "application/json"}), 400)
    assert "object" in err["message"]
    assert_untouched(gateway, mock)


@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings", "/v1/completions"])
def test_empty_body(gateway: RunningGateway, mock: MockUpstream, path: str) -> None:
    err = assert_error(gateway.post(path, b"", headers={"content-type": "application/json"}), 400)
    assert "empty" in err["message"]
    assert_untouched(gateway, mock)


def test_invalid_utf8(gateway: RunningGateway, mock: MockUpstream) -> None:
    raw = b'{"model": "auto", "messages": [{"role": "user", "content": "caf\xe9 \xff\xfe"}]}'
    err = assert_error(gateway.post(CHAT, raw, headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"] or "UTF-8" in err["message"]
    assert_untouched(gateway, mock)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "deep": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
    ],
    ids=["lists", "objects", "inside-a-request"],
)
def test_deeply_nested_json_is_400_not_500(gateway: RunningGateway, mock: MockUpstream, raw: bytes) -> None:
    assert_error(gateway.post(CHAT, raw, headers={"content-type": "application/json"}), 400)
    assert_untouched(gateway, mock)


# --------------------------------------------------------------------------- field types


WRONG_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"model": 123}, "model"),
    ({"model": None}, "model"),
    ({"model": ""}, "model"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "a"}, "b"]}, "messages[1]"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 5}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"tools": "search"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name"),
    ({"n": 0}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize(("patch", "param"), WRONG_FIELDS, ids=[p for _, p in WRONG_FIELDS])
def test_wrong_field_types_name_the_field(
    gateway: RunningGateway, mock: MockUpstream, patch: dict[str, Any], param: str
) -> None:
    err = assert_error(gateway.post(CHAT, {**OK_BODY, **patch}), 400, param=param)
    assert err["type"] == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in err["message"]
    assert_untouched(gateway, mock)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": HELLO}, "model"),
        (CHAT, {"model": "auto"}, "messages"),
        ("/v1/embeddings", {"model": "embed"}, "input"),
        ("/v1/embeddings", {"model": "embed", "input": 5}, "input"),
        ("/v1/completions", {"model": "legacy"}, "prompt"),
        ("/v1/completions", {"model": "legacy", "prompt": "hi", "stream": True}, "stream"),
    ],
)
def test_missing_or_wrong_fields_on_other_endpoints(
    gateway: RunningGateway, mock: MockUpstream, path: str, body: dict[str, Any], param: str
) -> None:
    assert_error(gateway.post(path, body), 400, param=param)
    assert_untouched(gateway, mock)


# --------------------------------------------------------------------------- size limit


@pytest.fixture
def small_limit_gateway(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    gw = start_gateway(tmp_path, mock_policy(mock.base_url, extra="server:\n  max_body_bytes: 1000\n"))
    try:
        yield gw
    finally:
        gw.stop()


def _body_of_size(size: int) -> bytes:
    head = b'{"model": "auto", "messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_body_over_limit_with_content_length(small_limit_gateway: RunningGateway, mock: MockUpstream) -> None:
    gw = small_limit_gateway
    ok = gw.post(CHAT, _body_of_size(1000), headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text  # exactly at the limit is fine
    mock.clear_requests()
    r = gw.post(CHAT, _body_of_size(1001), headers={"content-type": "application/json"})
    err = assert_error(r, 413, code="request_too_large")
    assert "1000" in err["message"]
    r = gw.post(CHAT, _body_of_size(50_000), headers={"content-type": "application/json"})
    assert_error(r, 413)
    assert mock.requests() == []


def test_chunked_body_over_limit(small_limit_gateway: RunningGateway, mock: MockUpstream) -> None:
    gw = small_limit_gateway
    body = _body_of_size(3000)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 200):
            yield body[i : i + 200]

    with httpx.Client(timeout=30) as c:
        small = c.post(gw.url + CHAT, content=iter([_body_of_size(900)]), headers=gw.headers())
        assert small.request.headers.get("transfer-encoding") == "chunked"
        assert small.status_code == 200, small.text
        mock.clear_requests()
        r = c.post(gw.url + CHAT, content=pieces(), headers=gw.headers())
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert_error(r, 413, code="request_too_large")
    assert mock.requests() == []


def test_embeddings_and_completions_share_the_limit(
    small_limit_gateway: RunningGateway, mock: MockUpstream
) -> None:
    gw = small_limit_gateway
    assert_error(gw.post("/v1/embeddings", {"model": "embed", "input": "x" * 2000}), 413)
    assert_error(gw.post("/v1/completions", {"model": "legacy", "prompt": "x" * 2000}), 413)
    assert mock.requests() == []


# --------------------------------------------------------------------------- paths and methods


@pytest.mark.parametrize("path", ["/v1/nope", "/v2/chat/completions", "/", "/v1/chat/completions/extra"])
def test_unknown_path_is_404_json(gateway: RunningGateway, path: str) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + path, json=OK_BODY, headers=gateway.headers())
    err = assert_error(r, 404)
    assert path in err["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", CHAT), ("PUT", CHAT), ("DELETE", "/v1/models"), ("GET", "/admin/policy/reload")],
)
def test_wrong_method_is_405_json(
    gateway: RunningGateway, mock: MockUpstream, method: str, path: str
) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.request(method, gateway.url + path, headers=gateway.headers())
    err = assert_error(r, 405)
    assert method in err["message"]
    assert_untouched(gateway, mock)


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer"},
        {"authorization": "Basic dXNlcjpwYXNz"},
    ],
    ids=["none", "empty-bearer", "basic"],
)
def test_missing_key_is_401(gateway: RunningGateway, mock: MockUpstream, headers: dict[str, str]) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + CHAT, json=OK_BODY, headers=headers)
    assert_error(r, 401, code="missing_api_key")
    assert_untouched(gateway, mock)


@pytest.mark.parametrize(
    "key", ["sk-sy-unknown0000000000000000000000000000000000", "not-even-a-key", "sk-sy-" + "x" * 5000]
)
def test_unknown_key_is_401(gateway: RunningGateway, mock: MockUpstream, key: str) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + CHAT, json=OK_BODY, headers={"authorization": f"Bearer {key}"})
        r2 = c.post(gateway.url + CHAT, json=OK_BODY, headers={"x-api-key": key})
    assert_error(r, 401, code="invalid_api_key")
    assert_error(r2, 401, code="invalid_api_key")
    assert key not in r.text
    assert_untouched(gateway, mock)


def test_key_in_x_api_key_header_works(gateway: RunningGateway) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + CHAT, json=OK_BODY, headers={"x-api-key": gateway.key()})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("echo: hello")
    assert gateway.ledger_rows()[0]["tenant"] == "team-a"


def test_auth_is_checked_before_the_body(gateway: RunningGateway, mock: MockUpstream) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + CHAT, content=b"{broken", headers={"content-type": "application/json"})
    assert_error(r, 401)
    assert_untouched(gateway, mock)


# --------------------------------------------------------------------------- admin


def test_admin_reload_with_tenant_key_is_403(gateway: RunningGateway) -> None:
    assert_error(gateway.post("/admin/policy/reload", b""), 403, code="not_admin")


def test_admin_reload_without_key_is_401(gateway: RunningGateway) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(gateway.url + "/admin/policy/reload")
    assert_error(r, 401)


def _chat_ok(gateway: RunningGateway, model: str = "auto") -> httpx.Response:
    r = gateway.post(CHAT, {"model": model, "messages": HELLO})
    assert r.status_code == 200, r.text
    return r


BROKEN_POLICIES = {
    "schema": (
        lambda url: mock_policy(url).replace("    retries: 1\n", "    retries: many\n    colour: blue\n", 1),
        {"routes.auto.retries", "routes.auto.colour"},
    ),
    "cross-reference": (
        lambda url: mock_policy(url).replace("targets: [small, large]", "targets: [small, huge]", 1),
        {"routes.auto.targets[1].model"},
    ),
    "yaml-syntax": (lambda url: mock_policy(url) + "\nroutes: [unclosed\n", {""}),
    "not-a-mapping": (lambda url: "- just\n- a list\n", {""}),
}


@pytest.mark.parametrize("kind", list(BROKEN_POLICIES))
def test_broken_policy_reload_is_422_and_keeps_the_old_policy(
    gateway: RunningGateway, mock: MockUpstream, kind: str
) -> None:
    make, paths = BROKEN_POLICIES[kind]
    gateway.write_policy(make(mock.base_url))
    r = gateway.post("/admin/policy/reload", b"", headers=ADMIN)
    err = assert_error(r, 422, code="invalid_policy")
    problems = err["problems"]
    assert {p["path"] for p in problems} == paths, problems
    assert all(isinstance(p["message"], str) and p["message"] for p in problems)
    if kind == "schema":
        assert {p["path"]: p["message"] for p in problems}["routes.auto.colour"] == "unknown field"
    if kind == "yaml-syntax":
        assert "line" in problems[0]["message"]
    # the running policy is untouched
    assert _chat_ok(gateway).headers["x-switchyard-model"] == "small"
    assert gateway.app_state.services.policy.routes["auto"].retries == 1


def test_good_policy_reloads_and_new_route_works(gateway: RunningGateway, mock: MockUpstream) -> None:
    assert_error(gateway.post(CHAT, {"model": "fresh", "messages": HELLO}), 404)
    fresh = "routes:\n  fresh:\n    targets: [large]\n"
    gateway.write_policy(mock_policy(mock.base_url).replace("routes:\n", fresh, 1))
    r = gateway.post("/admin/policy/reload", b"", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "reloaded"}
    assert _chat_ok(gateway, "fresh").headers["x-switchyard-model"] == "large"
    assert _chat_ok(gateway).headers["x-switchyard-model"] == "small"
    models = gateway.get("/v1/models", headers=gateway.headers()).json()
    assert "fresh" in {m["id"] for m in models["data"]}
