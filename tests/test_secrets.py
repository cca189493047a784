"""Secrets never leak: provider keys (canaries in the mock policy), clients' virtual keys and
the admin key stay out of responses, headers, /metrics, the ledger, files on disk, logs and
reprs — whatever the traffic, errors included. The mock proves the canaries are real (it did
receive them), so a gateway that dropped the keys entirely could not pass either."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from gateway.limits.keys import hash_key
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import ADMIN_KEY, RunningGateway, mock_policy, start_gateway

OPENAI_CANARY = "sk-upstream-canary-0123456789abcdef"
ANTHROPIC_CANARY = "sk-ant-canary-0123456789abcdef"
CANARIES = (OPENAI_CANARY, ANTHROPIC_CANARY)
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
NON_PROPAGATING = ("uvicorn", "uvicorn.access")


@dataclass
class Traffic:
    """Every response the gateway gave: status, headers and full body text."""

    gateway: RunningGateway
    mock: MockUpstream
    seen: list[tuple[str, int, str, str]] = field(default_factory=list)

    def record(self, label: str, r: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in r.headers.multi_items())
        self.seen.append((label, r.status_code, headers, r.text))
        return r

    def send(
        self,
        label: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str | None = "team-a",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        hdrs = {**(self.gateway.headers(tenant) if tenant else {}), **(headers or {})}
        kw: dict[str, Any] = {"headers": hdrs}
        if isinstance(body, bytes):
            kw["content"] = body
        elif body is not None:
            kw["json"] = body
        with httpx.Client(timeout=30) as c:
            return self.record(label, c.request(method, self.gateway.url + path, **kw))

    def chat(self, label: str, **body: Any) -> httpx.Response:
        return self.send(label, "POST", CHAT, {"messages": HELLO, **body})

    def faulted(self, label: str, faults: list[dict[str, Any]], **body: Any) -> httpx.Response:
        """One chat request while every upstream call fails with ``faults`` (then cleared)."""
        mock = self.mock
        before = len(mock.requests())
        mock.add_faults([{**f, "times": 20} for f in faults])
        try:
            r = self.chat(label, **body)
        finally:
            mock.clear_faults()
        assert len(mock.requests()) > before, f"{label}: the upstream was not called"
        return r

    def assert_clean(self, secrets: tuple[str, ...]) -> None:
        assert self.seen, "no traffic recorded"
        leaks = []
        for label, status, headers, text in self.seen:
            assert "Traceback" not in text, label
            for secret in secrets:
                if secret in headers:
                    leaks.append(f"{label} ({status}): secret in response headers")
                if secret in text:
                    leaks.append(f"{label} ({status}): secret in response body: {text[:300]}")
        assert not leaks, "\n".join(leaks)


@pytest.fixture
def gateway(tmp_path: Path, mock: MockUpstream) -> Iterator[RunningGateway]:
    """The mock policy with breakers that never open: every faulted request reaches the mock."""
    policy = mock_policy(mock.base_url).replace("failure_threshold: 3", "failure_threshold: 10000")
    gw = start_gateway(tmp_path, policy)
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture DEBUG logs of the root, switchyard and uvicorn loggers (uvicorn's own loggers
    do not propagate to the root, so the capture handler is attached to them directly)."""
    for name in ("", "switchyard", "uvicorn", "uvicorn.error", "uvicorn.access"):
        caplog.set_level(logging.DEBUG, logger=name)
    for name in NON_PROPAGATING:
        logging.getLogger(name).addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for name in NON_PROPAGATING:
            logging.getLogger(name).removeHandler(caplog.handler)


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    parts = [caplog.text]
    for rec in caplog.records:
        parts += [rec.getMessage(), repr(rec.args), rec.exc_text or ""]
    return "\n".join(parts)


def drive_everything(t: Traffic, mock: MockUpstream) -> None:
    gw = t.gateway
    # successes, both providers, JSON and SSE, with and without tools
    for route in ("auto", "anthropic-first"):
        t.chat(f"{route} ok", model=route)
        t.chat(f"{route} stream", model=route, stream=True, stream_options={"include_usage": True})
        t.chat(f"{route} tools", model=route, tools=TOOLS)
        t.chat(f"{route} cache miss", model=route, temperature=0)
        t.chat(f"{route} cache hit", model=route, temperature=0)
    t.send("embeddings", "POST", "/v1/embeddings", {"model": "embed", "input": ["a"]})
    t.send("completions", "POST", "/v1/completions", {"model": "legacy", "prompt": "hi"})
    # upstream refuses the gateway's credentials (OpenAI and Anthropic dialects)
    t.faulted("upstream 401", [{"kind": "status", "status": 401}], model="auto")
    t.faulted("upstream 401 anthropic", [{"kind": "status", "status": 401}], model="anthropic-first")
    t.faulted("upstream 403 anthropic", [{"kind": "status", "status": 403}], model="claude")
    # upstream failures
    t.faulted("upstream 500", [{"kind": "status", "status": 500}], model="auto")
    t.faulted("upstream 500 stream", [{"kind": "status", "status": 500}], model="auto", stream=True)
    t.faulted("upstream 529 anthropic", [{"kind": "status", "status": 529}], model="claude")
    t.faulted("upstream 429", [{"kind": "status", "status": 429, "retry_after": 60}], model="auto")
    # streams cut mid-way
    t.faulted("cut stream", [{"kind": "cut_mid_stream", "after_chunks": 2}], model="auto", stream=True)
    t.faulted(
        "cut anthropic stream", [{"kind": "cut_mid_stream", "after_chunks": 2}], model="claude", stream=True
    )
    t.faulted("malformed sse", [{"kind": "malformed_sse", "after_chunks": 1}], model="auto", stream=True)
    # bad input and refusals
    t.send("malformed json", "POST", CHAT, b'{"model": "auto", ')
    t.chat("bad temperature", model="auto", temperature=5)
    t.chat("unknown model", model="nope")
    t.send("forbidden route", "POST", CHAT, {"model": "restricted", "messages": HELLO}, tenant="team-b")
    t.send("no key", "POST", CHAT, {"model": "auto", "messages": HELLO}, tenant=None)
    for canary in (*CANARIES, ADMIN_KEY):  # someone sends a secret as their client key
        t.send(
            "secret as client key",
            "POST",
            CHAT,
            {"model": "auto", "messages": HELLO},
            tenant=None,
            headers={"authorization": f"Bearer {canary}"},
        )
        t.send(
            "secret as x-api-key",
            "POST",
            CHAT,
            {"model": "auto", "messages": HELLO},
            tenant=None,
            headers={"x-api-key": canary},
        )
    for _ in range(6):
        t.send("rate limited", "POST", CHAT, {"model": "auto", "messages": HELLO}, tenant="team-b")
    # admin: wrong key, right key, broken policy that carries a key in a bad place
    t.send("admin with tenant key", "POST", "/admin/policy/reload")
    t.send(
        "admin ok",
        "POST",
        "/admin/policy/reload",
        tenant=None,
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    broken = (
        mock_policy(mock.base_url)
        .replace(
            f"api_key: {OPENAI_CANARY}\n", f"api_key: {OPENAI_CANARY}\n    key_note: {OPENAI_CANARY}\n", 1
        )
        .replace("base_url: " + mock.base_url + "\n", f"base_url: ftp://{ANTHROPIC_CANARY}@x\n", 1)
    )
    gw.write_policy(broken)
    t.send(
        "admin broken policy",
        "POST",
        "/admin/policy/reload",
        tenant=None,
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    gw.write_policy(mock_policy(mock.base_url))
    # observability endpoints
    for path in ("/metrics", "/healthz", "/readyz", "/v1/models", "/v1/nowhere"):
        t.send(f"GET {path}", "GET", path)


def test_no_secret_leaks_anywhere(
    gateway: RunningGateway, mock: MockUpstream, logs: pytest.LogCaptureFixture
) -> None:
    t = Traffic(gateway, mock)
    drive_everything(t, mock)
    client_keys = tuple(gateway.keys.values())
    assert len(client_keys) == 2  # team-a and team-b
    secrets = (*CANARIES, ADMIN_KEY, *client_keys)

    # the traffic really happened, with real failures
    statuses = {status for _, status, _, _ in t.seen}
    assert {200, 400, 401, 403, 404, 422, 429, 502} <= statuses, statuses
    broken_reload = [text for label, _, _, text in t.seen if label == "admin broken policy"]
    assert "problems" in broken_reload[0]

    # the canaries are real: the mock received them, and never a client or admin key
    upstream = mock.requests()
    openai_auth = {r["headers"].get("authorization") for r in upstream if r["path"] == "/v1/chat/completions"}
    anthropic_auth = {r["headers"].get("x-api-key") for r in upstream if r["path"] == "/v1/messages"}
    assert openai_auth == {f"Bearer {OPENAI_CANARY}"}
    assert anthropic_auth == {ANTHROPIC_CANARY}
    for key in (ADMIN_KEY, *client_keys):
        assert key not in repr(upstream), "a client/admin key was forwarded upstream"

    t.assert_clean(secrets)

    metrics = gateway.get("/metrics").text
    assert "switchyard_requests" in metrics
    for secret in secrets:
        assert secret not in metrics

    rows = gateway.ledger_rows()
    assert len(rows) >= 20
    assert {r["status"] for r in rows} >= {"ok", "error", "stream_broken"}
    dump = repr(rows)
    for secret in secrets:
        assert secret not in dump, "secret in a ledger row"
    assert {hash_key(k)[:12] for k in client_keys} <= {r["key_id"] for r in rows}

    on_disk = {p: p.read_bytes() for p in gateway.home.rglob("*") if p.is_file()}
    assert any(p.name == "keys.db" for p in on_disk)
    blob = b"".join(on_disk.values())
    for secret in secrets:
        assert secret.encode() not in blob, "secret stored in a file under the gateway home"
    for key in client_keys:
        assert hash_key(key).encode() in blob, "the key store should hold the key's hash"

    text = log_text(logs)
    assert logs.records, "no log records captured at DEBUG"
    for secret in secrets:
        assert secret not in text, "secret in the logs"


def test_upstream_error_that_echoes_the_key_is_not_relayed(
    gateway: RunningGateway, mock: MockUpstream, logs: pytest.LogCaptureFixture
) -> None:
    """Some OpenAI-compatible servers echo the presented key in their error message; the
    gateway must not hand that message (and so the provider key) to its client."""
    t = Traffic(gateway, mock)
    echo = f"Incorrect API key provided: {OPENAI_CANARY}"
    for status in (400, 401, 404, 422, 500):
        fault = {"kind": "status", "status": status, "message": echo}
        assert t.faulted(f"upstream {status} echoing the key", [fault], model="auto").status_code >= 400
        r = t.faulted(f"upstream {status} echoing the key, stream", [fault], model="auto", stream=True)
        assert r.status_code >= 400
    fault = {"kind": "status", "status": 500, "message": f"bad x-api-key {ANTHROPIC_CANARY}"}
    assert t.faulted("anthropic 500 echoing the key", [fault], model="claude").status_code == 502
    t.assert_clean(CANARIES)
    rows = repr(gateway.ledger_rows())
    text = log_text(logs)
    for canary in CANARIES:
        assert canary not in rows
        assert canary not in text


def test_reprs_hide_secrets(gateway: RunningGateway) -> None:
    state = gateway.app_state
    runtime = state.services
    assert set(runtime.providers) == {"mock", "mock-anthropic"}
    objects: dict[str, object] = {
        "settings": gateway.settings,
        "app settings": state.services.settings,
        "admin key": state.services.settings.admin_key,
        **{f"provider {name}": p for name, p in runtime.providers.items()},
    }
    for label, obj in objects.items():
        shown = repr(obj) + str(obj)
        for secret in (*CANARIES, ADMIN_KEY):
            assert secret not in shown, f"repr/str of {label} shows a secret: {shown[:300]}"
    assert (
        state.services.settings.admin_key is not None and state.services.settings.admin_key.get() == ADMIN_KEY
    )


POLICY_OBJECTS: dict[str, Any] = {
    "openai provider policy": lambda rt: rt.policy.providers["mock"],
    "anthropic provider policy": lambda rt: rt.policy.providers["mock-anthropic"],
    "policy": lambda rt: rt.policy,
    "services": lambda rt: rt,
}


@pytest.mark.parametrize("label", list(POLICY_OBJECTS))
def test_policy_objects_repr_hide_provider_keys(gateway: RunningGateway, label: str) -> None:
    """The parsed policy (and the services built from it) end up in reprs, debuggers and error
    reports; the provider API keys in it must be redacted there too."""
    runtime = gateway.app_state.services
    assert runtime.policy.providers["mock"].api_key == OPENAI_CANARY  # the key is there...
    obj = POLICY_OBJECTS[label](runtime)
    shown = repr(obj) + str(obj)
    assert "127.0.0.1" in shown  # a real repr of the object, with its base_url
    leaked = [c for c in CANARIES if c in shown]
    assert not leaked, f"repr/str of the {label} shows provider keys"  # ...but not shown


def test_secrets_logged_by_any_code_are_redacted(
    gateway: RunningGateway, logs: pytest.LogCaptureFixture
) -> None:
    """The redacting filter covers whatever code logs a secret: any logger, %-args, reprs of
    containers, exception text. A reload (real admin call) installs it on current handlers,
    as start-up does in production where handlers exist before the app starts."""
    r = gateway.post(
        "/admin/policy/reload", b"", tenant="team-a", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert r.status_code == 200, r.text
    client_key = gateway.key()
    secrets = (*CANARIES, ADMIN_KEY, client_key)
    for name in ("switchyard", "switchyard.pipeline", "gateway.ledger.store", "uvicorn.error", ""):
        log = logging.getLogger(name)
        log.warning("upstream key %s, anthropic %s", OPENAI_CANARY, ANTHROPIC_CANARY)
        log.error("headers %r", {"authorization": f"Bearer {client_key}", "x-api-key": ANTHROPIC_CANARY})
        log.info("admin presented %s", ADMIN_KEY)
        try:
            raise RuntimeError(f"call failed with key {OPENAI_CANARY}")
        except RuntimeError:
            log.exception("unexpected")
    assert len([r for r in logs.records if r.getMessage().startswith("upstream key")]) == 5
    text = log_text(logs)
    assert "[REDACTED]" in text
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"secrets in the logs: {leaked}"


def test_anthropic_mid_stream_error_event_echoing_the_key_is_scrubbed() -> None:
    """An Anthropic ``error`` event arriving mid-stream becomes the SSE error event the client
    sees (pipeline._relay relays the exception message). The mock cannot inject such an event,
    so this drives the pure stream translator directly."""
    from gateway.core.errors import StreamBrokenError
    from gateway.protocols.anthropic_events import StreamTranslator

    translator = StreamTranslator("claude-mock", provider="mock-anthropic")
    translator.feed("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {}}})
    event = {"type": "error", "error": {"type": "api_error", "message": f"bad x-api-key {ANTHROPIC_CANARY}"}}
    with pytest.raises(StreamBrokenError) as info:
        translator.feed("error", event)
    assert "api_error" in info.value.message
    assert ANTHROPIC_CANARY not in info.value.message


def test_upstream_error_that_echoes_a_masked_key_is_scrubbed(
    gateway: RunningGateway, mock: MockUpstream
) -> None:
    """Upstreams quote a key masked: its first characters, stars or dots, its last four
    (``Incorrect API key provided: pk_live_****8293``). None of those fragments reach the
    client or the ledger."""
    t = Traffic(gateway, mock)
    head, tail = OPENAI_CANARY[:7], OPENAI_CANARY[-4:]
    masked = (f"{head}****{tail}", f"{head}...{tail}", f"sk-********************{tail}", f"***{tail}")
    for form in masked:
        fault = {"kind": "status", "status": 400, "message": f"Incorrect API key provided: {form}. See docs."}
        t.faulted(f"400 echoing {form}", [fault], model="auto")
        t.faulted(f"400 echoing {form}, stream", [fault], model="auto", stream=True)
    bodies = " ".join(text for _, _, _, text in t.seen)
    assert "Incorrect API key provided" in bodies  # the upstream's message is relayed...
    assert tail not in bodies and head not in bodies  # ...without the key's fragments
    assert tail not in repr(gateway.ledger_rows())


def test_masked_forms_of_a_key_are_redacted_and_ordinary_text_is_not() -> None:
    from gateway.core.redact import MASK, redact

    key = "pk_live_Ab3xQ9zLmN0pR7sT8293"
    for form in (
        "pk_live_****8293",
        "pk_l...8293",
        "****8293",
        "pk_live_\u2026",
        "sk-proj-****************wxyz",
    ):
        text = redact(f"Incorrect API key provided: {form}. See the docs.", [key])
        assert text == f"Incorrect API key provided: {MASK}. See the docs.", form
    for plain in ("Loading... done", "2**10 tokens", "wait...ok", "a ** b", "see https://x.y/a...", "v1.2.3"):
        assert redact(plain, [key]) == plain


def test_redaction_stays_linear_on_long_runs_of_key_characters() -> None:
    """A megabyte of key characters next to a mask-like run (an error echoing a huge model
    name) is scanned in linear time: an open-ended regex head backtracked quadratically."""
    import time

    from gateway.core.redact import redact

    secrets = ("sk-upstream-canary-0123456789abcdef",)
    for text in (
        "The model '" + "m" * 1_000_000 + "' is not served.",
        "x" * 500_000 + "****" + "y" * 500_000,
    ):
        started = time.perf_counter()
        redact(text, secrets)
        assert time.perf_counter() - started < 1.0
    assert redact("key pk_live_****8293.", secrets) == "key [REDACTED]."
