"""Policy loader and schema: every problem with its YAML path; the CLI's `policy check`;
route sampling parameters as the upstream sees them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loader import PolicyError, load_policy, parse_policy
from gateway.config.policy import Policy
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway

REPO = Path(__file__).resolve().parent.parent
POLICY_FILES = sorted((REPO / "policies").glob("*.yaml"))

# A small valid policy; tests break one thing at a time.
BASE = """\
providers:
  p:
    type: openai
    base_url: http://127.0.0.1:9/v1
    api_key: sk-test
models:
  m1:
    provider: p
    price: {input: 1, output: 2}
  m2:
    provider: p
    price: {input: 1, output: 2}
routes:
  auto:
    targets: [m1, m2]
  chat:
    targets: [m1, m2]
"""


def problems_of(text: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "test.yaml", env={} if env is None else env)
    return info.value.problems


def ok(text: str, env: dict[str, str] | None = None) -> Policy:
    return parse_policy(text, "test.yaml", env={} if env is None else env)


# ----------------------------------------------------------------------------- shipped files
def test_there_are_shipped_policies() -> None:
    assert REPO / "policies" / "default.yaml" in POLICY_FILES


@pytest.mark.parametrize("path", POLICY_FILES, ids=[p.name for p in POLICY_FILES])
def test_shipped_policy_loads_with_an_empty_environment(path: Path) -> None:
    policy = load_policy(path, env={})
    assert policy.routes, f"{path.name} defines no routes"
    for name, route in policy.routes.items():
        assert route.targets, name


def test_default_policy_without_keys_loads_with_unconfigured_providers() -> None:
    policy = load_policy(REPO / "policies" / "default.yaml", env={})
    assert set(policy.routes) >= {"auto", "code", "creative"}
    assert policy.providers["openai"].base_url == "https://api.openai.com/v1"
    assert policy.providers["openai"].api_key == ""
    assert not policy.providers["openai"].configured
    assert not policy.providers["anthropic"].configured


def test_default_policy_takes_keys_and_base_url_from_env() -> None:
    env = {"OPENAI_API_KEY": "sk-from-env-123", "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1/"}
    policy = load_policy(REPO / "policies" / "default.yaml", env=env)
    assert policy.providers["openai"].api_key == "sk-from-env-123"
    assert policy.providers["openai"].base_url == "http://127.0.0.1:8000/v1"  # trailing slash dropped
    assert policy.providers["openai"].configured
    assert not policy.providers["anthropic"].configured


def test_base_policy_is_valid() -> None:
    policy = ok(BASE)
    assert [t.model for t in policy.routes["chat"].targets] == ["m1", "m2"]


# ----------------------------------------------------------------------------- unknown keys
@pytest.mark.parametrize(
    ("text", "path"),
    [
        (BASE + "bogus: 1\n", "bogus"),
        (
            BASE.replace("  auto:\n    targets: [m1, m2]", "  auto:\n    targetz: [m1, m2]"),
            "routes.auto.targetz",
        ),
        (
            BASE.replace("    targets: [m1, m2]\n", "    targets: [m1, m2]\n    retry: 3\n", 1),
            "routes.auto.retry",
        ),
        (BASE.replace("    type: openai\n", "    type: openai\n    apikey: x\n"), "providers.p.apikey"),
        (BASE.replace("    provider: p\n", "    provider: p\n    prise: 1\n", 1), "models.m1.prise"),
        (
            BASE.replace("{input: 1, output: 2}", "{input: 1, output: 2, outptu: 3}", 1),
            "models.m1.price.outptu",
        ),
        (BASE.replace("[m1, m2]", "[{model: m1, weight: 2}]", 1), "routes.auto.targets[0].weight"),
        (BASE + "    params: {pinned: {temperature: 0}, pinn: {}}\n", "routes.chat.params.pinn"),
        (BASE + "    cache: {mode: always, ttl: 5}\n", "routes.chat.cache.ttl"),
        (BASE + "server: {auth: keys, max_body: 5}\n", "server.max_body"),
        (BASE + "cache: {backend: memory, maxbytes: 5}\n", "cache.maxbytes"),
        (BASE + "tenants: {t1: {models: ['*'], rpmm: 5}}\n", "tenants.t1.rpmm"),
        (BASE + "breaker: {failure_threshold: 2, open_s: 1}\n", "breaker.open_s"),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v else None,
)
def test_unknown_key_is_rejected_with_its_yaml_path(text: str, path: str) -> None:
    assert (path, "unknown field") in problems_of(text)


def test_unknown_key_in_route_also_reports_the_missing_required_field() -> None:
    text = BASE.replace("  auto:\n    targets: [m1, m2]", "  auto:\n    targetz: [m1, m2]")
    assert sorted(problems_of(text)) == [
        ("routes.auto.targets", "Field required"),
        ("routes.auto.targetz", "unknown field"),
    ]


def test_every_schema_problem_is_reported_at_once() -> None:
    text = BASE + "bogus: 1\nserver: {max_body_bytes: 0, auth: maybe}\n"
    problems = problems_of(text)
    paths = sorted(p for p, _ in problems)
    assert paths == ["bogus", "server.auth", "server.max_body_bytes"]


# ----------------------------------------------------------------------------- wrong types
@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        (BASE + "    retries: many\n", "routes.chat.retries", "valid integer"),
        (BASE + "    retries: 11\n", "routes.chat.retries", "less than or equal to 10"),
        (BASE + "    deadline_s: -1\n", "routes.chat.deadline_s", "greater than 0"),
        (BASE.replace("[m1, m2]", "m1", 1), "routes.auto.targets", "valid list"),
        (
            BASE.replace("    targets: [m1, m2]\n", "    targets: []\n", 1),
            "routes.auto.targets",
            "at least 1",
        ),
        (BASE.replace("{input: 1,", "{input: cheap,", 1), "models.m1.price.input", "decimal"),
        (BASE.replace("{input: 1,", "{input: -1,", 1), "models.m1.price.input", "greater than or equal to 0"),
        (BASE.replace("type: openai", "type: gemini"), "providers.p.type", "'openai' or 'anthropic'"),
        (BASE.replace("http://127.0.0.1:9/v1", "ftp://127.0.0.1/v1"), "providers.p.base_url", "http://"),
        (BASE + "server: {log_prompts: sometimes}\n", "server.log_prompts", "valid boolean"),
        (BASE + "cache: {backend: memcached}\n", "cache.backend", "'memory' or 'redis'"),
        (BASE + "tenants: {t1: {models: auto}}\n", "tenants.t1.models", "valid list"),
        (BASE + "version: 2\n", "version", "1"),
        (BASE + "routes2: 1\n", "routes2", "unknown field"),
        ("providers: [a, b]\n", "providers", "valid dictionary"),
    ],
)
def test_wrong_type_reports_path_and_reason(text: str, path: str, fragment: str) -> None:
    problems = problems_of(text)
    matching = [m for p, m in problems if p == path]
    assert matching, f"no problem at {path}: {problems}"
    assert any(fragment in m for m in matching), matching


# ----------------------------------------------------------------------------- cross references
def test_unknown_model_in_targets_is_named_with_its_index() -> None:
    text = BASE.replace("  chat:\n    targets: [m1, m2]", "  chat:\n    targets: [m1, gpt-4x]")
    assert problems_of(text) == [("routes.chat.targets[1].model", "unknown model 'gpt-4x'")]


def test_unknown_baseline_model() -> None:
    assert problems_of(BASE + "    baseline: gpt-9\n") == [("routes.chat.baseline", "unknown model 'gpt-9'")]


def test_unknown_provider() -> None:
    text = BASE.replace("    provider: p\n", "    provider: nope\n", 1)
    assert problems_of(text) == [("models.m1.provider", "unknown provider 'nope'")]


def test_route_name_clashing_with_a_model_name() -> None:
    text = BASE + "  m2:\n    targets: [m1]\n"
    assert problems_of(text) == [("routes.m2", "route name 'm2' clashes with a model name")]


def test_unknown_tenant_model() -> None:
    assert problems_of(BASE + "tenants: {t1: {models: [auto, m1, nothing]}}\n") == [
        ("tenants.t1.models[2]", "unknown route or model 'nothing'")
    ]


def test_route_mixing_model_kinds() -> None:
    text = BASE.replace(
        "    price: {input: 1, output: 2}\n", "    kind: embeddings\n    price: {input: 1, output: 2}\n", 1
    )
    problems = problems_of(text)
    assert ("routes.auto.targets", "targets mix model kinds ['chat', 'embeddings']") in problems
    assert ("routes.chat.targets", "targets mix model kinds ['chat', 'embeddings']") in problems


def test_every_cross_reference_problem_is_reported_at_once() -> None:
    text = BASE.replace("    provider: p\n", "    provider: nope\n", 1).replace(
        "  chat:\n    targets: [m1, m2]", "  chat:\n    targets: [x1, m2, x3]"
    )
    assert problems_of(text) == [
        ("models.m1.provider", "unknown provider 'nope'"),
        ("routes.chat.targets[0].model", "unknown model 'x1'"),
        ("routes.chat.targets[2].model", "unknown model 'x3'"),
    ]


def test_redis_backend_needs_a_url() -> None:
    assert problems_of(BASE + "cache: {backend: redis}\n") == [
        ("cache.redis_url", "required when cache.backend is 'redis'")
    ]
    policy = ok(BASE + "cache: {backend: redis, redis_url: 'redis://127.0.0.1:6379/0'}\n")
    assert policy.cache.backend == "redis"
    assert policy.cache.redis_url == "redis://127.0.0.1:6379/0"


# ----------------------------------------------------------------------------- ${ENV} references
def test_missing_env_var_is_named_with_its_path() -> None:
    text = BASE.replace("api_key: sk-test", "api_key: ${SY_TEST_MISSING_KEY}")
    assert problems_of(text) == [
        ("providers.p.api_key", "environment variable SY_TEST_MISSING_KEY is not set")
    ]


def test_missing_env_vars_are_all_reported_with_list_paths() -> None:
    text = BASE.replace("[m1, m2]", "[m1, '${SY_TEST_MODEL}']", 1).replace(
        "base_url: http://127.0.0.1:9/v1", "base_url: 'http://${SY_TEST_HOST}/v1'"
    )
    assert problems_of(text) == [
        ("providers.p.base_url", "environment variable SY_TEST_HOST is not set"),
        ("routes.auto.targets[1]", "environment variable SY_TEST_MODEL is not set"),
    ]


def test_env_var_is_substituted() -> None:
    text = BASE.replace("api_key: sk-test", "api_key: ${SY_TEST_KEY}").replace(
        "base_url: http://127.0.0.1:9/v1", "base_url: 'http://${SY_TEST_HOST}:8000/v1'"
    )
    policy = ok(text, env={"SY_TEST_KEY": "sk-abc", "SY_TEST_HOST": "10.0.0.7"})
    assert policy.providers["p"].api_key == "sk-abc"
    assert policy.providers["p"].base_url == "http://10.0.0.7:8000/v1"


def test_env_default_is_used_when_unset_or_empty() -> None:
    text = BASE.replace("http://127.0.0.1:9/v1", "${SY_TEST_URL:-http://fallback:1/v1}")
    assert ok(text).providers["p"].base_url == "http://fallback:1/v1"
    assert ok(text, env={"SY_TEST_URL": ""}).providers["p"].base_url == "http://fallback:1/v1"
    assert ok(text, env={"SY_TEST_URL": "http://set:2/v1"}).providers["p"].base_url == "http://set:2/v1"


def test_empty_env_default() -> None:
    text = BASE.replace("api_key: sk-test", "api_key: ${SY_TEST_KEY:-}")
    policy = ok(text)
    assert policy.providers["p"].api_key == ""
    assert not policy.providers["p"].configured


def test_env_reference_in_a_non_string_field_is_validated_after_substitution() -> None:
    text = BASE + "    retries: ${SY_TEST_RETRIES:-3}\n"
    assert ok(text).routes["chat"].retries == 3
    assert ok(text, env={"SY_TEST_RETRIES": "7"}).routes["chat"].retries == 7
    assert problems_of(text, env={"SY_TEST_RETRIES": "lots"}) == [
        ("routes.chat.retries", "Input should be a valid integer, unable to parse string as an integer")
    ]


CANARY = "sk-canary-SECRET-5f1e2d3c4b5a69788796"


@pytest.mark.parametrize(
    "text",
    [
        # the secret where it belongs, another field invalid
        BASE.replace("api_key: sk-test", "api_key: ${SY_CANARY}") + "    retries: many\n",
        BASE.replace("api_key: sk-test", "api_key: ${SY_CANARY}") + "bogus: 1\n",
        BASE.replace("api_key: sk-test", "api_key: ${SY_CANARY}").replace("[m1, m2]", "[m1, nope]", 1),
        # the secret itself lands in a field that fails validation
        BASE.replace("http://127.0.0.1:9/v1", "${SY_CANARY}"),
        BASE.replace("type: openai", "type: ${SY_CANARY}"),
        BASE + "    retries: ${SY_CANARY}\n",
        BASE + "server: {log_prompts: '${SY_CANARY}'}\n",
        BASE.replace("{input: 1,", "{input: '${SY_CANARY}',", 1),
        # ... or in a cross reference, whose message quotes the value
        BASE.replace("    provider: p\n", "    provider: ${SY_CANARY}\n", 1),
        BASE.replace("[m1, m2]", "[m1, '${SY_CANARY}']", 1),
        BASE + "    baseline: ${SY_CANARY}\n",
        BASE + "tenants: {t1: {models: ['${SY_CANARY}']}}\n",
        BASE + "tenants: {t1: {models: ['x-${SY_CANARY}']}}\n",
    ],
)
def test_substituted_secret_never_appears_in_errors(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"SY_CANARY": CANARY}
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "test.yaml", env=env)
    exc = info.value
    assert exc.problems
    everything = exc.render() + str(exc) + repr(exc) + repr(exc.problems)
    assert CANARY not in everything
    assert "SECRET" not in everything
    # the same through the real process environment (the default env source)
    monkeypatch.setenv("SY_CANARY", CANARY)
    with pytest.raises(PolicyError) as info2:
        parse_policy(text, "test.yaml")
    assert CANARY not in info2.value.render()


def test_secret_in_a_cross_reference_is_shown_as_its_reference() -> None:
    text = BASE.replace("    provider: p\n", "    provider: ${SY_CANARY}\n", 1)
    assert problems_of(text, env={"SY_CANARY": CANARY}) == [
        ("models.m1.provider", "unknown provider '${SY_CANARY}'")
    ]


def test_empty_env_value_in_a_cross_reference_keeps_the_message_intact() -> None:
    text = BASE.replace("    provider: p\n", "    provider: 'x${SY_EMPTY}'\n", 1)
    assert problems_of(text, env={"SY_EMPTY": ""}) == [("models.m1.provider", "unknown provider 'x'")]


def test_default_value_in_a_cross_reference_is_shown() -> None:
    # defaults are written in the file, not secrets: keep the message useful
    text = BASE.replace("    provider: p\n", "    provider: ${SY_PROVIDER:-pp}\n", 1)
    assert problems_of(text) == [("models.m1.provider", "unknown provider 'pp'")]


# ----------------------------------------------------------------------------- YAML errors
def test_invalid_yaml_reports_a_line_number() -> None:
    text = BASE + "  broken:\n    targets: [m1\n  other: {targets: [m2]}\n"
    problems = problems_of(text)
    assert len(problems) == 1
    path, message = problems[0]
    assert path == ""
    assert message.startswith("invalid YAML: line ")
    # BASE has 17 lines; the unclosed `[m1` on line 19 is detected at `other:` (line 20, 1-based)
    assert message == "invalid YAML: line 20, column 8: expected ',' or ']', but got ':'"


def test_invalid_yaml_bad_indent_line() -> None:
    text = "providers:\n  p:\n    type: openai\n   base_url: x\n"
    (problem,) = problems_of(text)
    assert "line 4" in problem[1], problem


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_yaml_is_rejected(text: str) -> None:
    assert problems_of(text) == [("", "the policy must be a YAML mapping")]


def test_empty_file_is_an_empty_policy() -> None:
    policy = ok("")
    assert policy.routes == {} and policy.models == {}


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "missing.yaml")
    (problem,) = info.value.problems
    assert problem[0] == "" and problem[1].startswith("cannot read policy file")
    assert str(tmp_path / "missing.yaml") in info.value.render()


def test_non_utf8_file(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"bogus: \xff\xfe\n")
    with pytest.raises(PolicyError) as info:
        load_policy(f)
    assert info.value.problems == [("", "policy file is not valid UTF-8")]


def test_policy_error_render_lists_every_problem() -> None:
    err = PolicyError("f.yaml", [("a.b", "bad"), ("", "worse")])
    assert err.render() == "f.yaml: 2 problem(s)\n  a.b: bad\n  worse"
    assert str(err) == err.render()


# ----------------------------------------------------------------------------- CLI
def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "SY_"))}
    run_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=run_env,
    )


BAD_CLI = BASE.replace("    provider: p\n", "    provider: nope\n", 1).replace(
    "  chat:\n    targets: [m1, m2]", "  chat:\n    targets: [m1, gpt-4x]"
)


def test_cli_policy_check_prints_every_error_and_exits_1(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(BAD_CLI)
    proc = _cli("policy", "check", str(f))
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    assert f"{f}: 2 problem(s)" in proc.stderr
    assert "models.m1.provider: unknown provider 'nope'" in proc.stderr
    assert "routes.chat.targets[1].model: unknown model 'gpt-4x'" in proc.stderr


def test_cli_policy_check_schema_errors(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        BASE.replace("  auto:\n    targets: [m1, m2]", "  auto:\n    targetz: [m1, m2]") + "bogus: 1\n"
    )
    proc = _cli("policy", "check", str(f))
    assert proc.returncode == 1
    assert "routes.auto.targetz: unknown field" in proc.stderr
    assert "bogus: unknown field" in proc.stderr
    assert "routes.auto.targets: Field required" in proc.stderr


def test_cli_policy_check_ok(tmp_path: Path) -> None:
    f = tmp_path / "good.yaml"
    f.write_text(BASE)
    proc = _cli("policy", "check", str(f))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{f}: ok (2 routes, 2 models, 1 providers)"


def test_cli_policy_check_default_policy_without_keys() -> None:
    proc = _cli("policy", "check", "policies/default.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "policies/default.yaml: ok (5 routes" in proc.stdout
    assert "anthropic, openai" in proc.stdout  # the note about providers without a key


def test_cli_policy_check_json_on_errors(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(BAD_CLI)
    proc = _cli("policy", "check", str(f), "--json")
    assert proc.returncode == 1
    assert proc.stdout.count("\n") == 1  # exactly one JSON document on one line
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc == {
        "ok": False,
        "file": str(f),
        "problems": [
            {"path": "models.m1.provider", "message": "unknown provider 'nope'"},
            {"path": "routes.chat.targets[1].model", "message": "unknown model 'gpt-4x'"},
        ],
    }


def test_cli_policy_check_json_ok(tmp_path: Path) -> None:
    f = tmp_path / "good.yaml"
    f.write_text(BASE.replace("api_key: sk-test", "api_key: ${SY_TEST_KEY:-}"))
    proc = _cli("policy", "check", str(f), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == {
        "ok": True,
        "file": str(f),
        "routes": ["auto", "chat"],
        "models": ["m1", "m2"],
        "providers_without_key": ["p"],
    }


def test_cli_policy_check_json_invalid_yaml(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("a: [1\nb: 2\n")
    proc = _cli("policy", "check", str(f), "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False
    assert len(doc["problems"]) == 1 and doc["problems"][0]["path"] == ""
    assert "line " in doc["problems"][0]["message"]


def test_cli_policy_check_never_prints_a_substituted_secret(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(BASE.replace("    provider: p\n", "    provider: ${SY_CANARY}\n", 1))
    for extra in ((), ("--json",)):
        proc = _cli("policy", "check", str(f), *extra, env={"SY_CANARY": CANARY})
        assert proc.returncode == 1
        assert CANARY not in proc.stdout + proc.stderr
        assert "${SY_CANARY}" in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- route params
def _chat(gateway: RunningGateway, route: str, **params: Any) -> dict[str, Any]:
    body = {"model": route, "messages": [{"role": "user", "content": "params"}], **params}
    r = gateway.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def _upstream_body(mock: MockUpstream) -> dict[str, Any]:
    chats = [r for r in mock.requests() if r["path"].endswith("/chat/completions")]
    assert len(chats) == 1, chats
    body: dict[str, Any] = chats[0]["body"]
    mock.clear_requests()
    return body


def test_code_route_pins_temperature_and_top_p(gateway: RunningGateway, mock: MockUpstream) -> None:
    _chat(gateway, "code", temperature=1.7, top_p=0.9, max_tokens=5)
    sent = _upstream_body(mock)
    assert sent["temperature"] == 0.1 and sent["top_p"] == 0.2
    assert sent["max_tokens"] == 5  # other params pass through
    assert sent["model"] == "mock-small"
    _chat(gateway, "code")
    sent = _upstream_body(mock)
    assert sent["temperature"] == 0.1 and sent["top_p"] == 0.2


def test_creative_route_default_and_cap(gateway: RunningGateway, mock: MockUpstream) -> None:
    _chat(gateway, "creative")
    assert _upstream_body(mock)["temperature"] == 0.9
    _chat(gateway, "creative", temperature=1.5)
    assert _upstream_body(mock)["temperature"] == 1.2
    _chat(gateway, "creative", temperature=0.3)
    assert _upstream_body(mock)["temperature"] == 0.3
    sent = (_chat(gateway, "creative", top_p=0.5), _upstream_body(mock))[1]
    assert sent["temperature"] == 0.9 and sent["top_p"] == 0.5


def test_route_without_params_passes_the_client_values(gateway: RunningGateway, mock: MockUpstream) -> None:
    _chat(gateway, "auto", temperature=1.5)
    sent = _upstream_body(mock)
    assert sent["temperature"] == 1.5
    assert "top_p" not in sent


def test_parsed_policy_repr_hides_provider_keys_and_headers() -> None:
    text = BASE.replace(
        "api_key: sk-test", "api_key: ${SY_CANARY}\n    headers: {x-extra-auth: '${SY_CANARY2}'}"
    )
    policy = ok(text, env={"SY_CANARY": CANARY, "SY_CANARY2": "hdr-canary-77aa88bb99cc"})
    assert policy.providers["p"].api_key == CANARY  # the values are there...
    assert policy.providers["p"].headers == {"x-extra-auth": "hdr-canary-77aa88bb99cc"}
    for obj in (policy, policy.providers["p"], policy.providers):
        shown = repr(obj) + str(obj)
        assert CANARY not in shown and "hdr-canary" not in shown  # ...but never shown
    assert "base_url='http://127.0.0.1:9/v1'" in repr(policy.providers["p"])  # the rest still is


# ----------------------------------------------------------------------------- one pass
MIXED = (
    BASE.replace("    api_key: sk-test\n", "    api_key: ${SY_TEST_UNSET_KEY}\n", 1)
    .replace(
        "  m2:\n    provider: p\n    price: {input: 1, output: 2}",
        "  m2:\n    provider: p\n    price: {input: x, output: 2}",
    )
    .replace(
        "  chat:\n    targets: [m1, m2]", "  chat:\n    targets: [m1, gpt-4x]\n  other:\n    targets: [m2]"
    )
    + "cache: {backend: redis}\nbogus: 1\n"
)


def test_every_kind_of_problem_is_reported_in_one_pass() -> None:
    """A missing variable, schema errors and dangling references in one file: all of them, each
    with its path; a reference to an entry that is itself broken (routes.other -> m2) is not
    reported twice."""
    problems = problems_of(MIXED)
    assert ("providers.p.api_key", "environment variable SY_TEST_UNSET_KEY is not set") in problems
    assert ("bogus", "unknown field") in problems
    assert any(path == "models.m2.price.input" for path, _ in problems)
    assert ("routes.chat.targets[1].model", "unknown model 'gpt-4x'") in problems
    assert ("cache.redis_url", "required when cache.backend is 'redis'") in problems
    assert len(problems) == 5, problems


def test_cli_policy_check_lists_every_problem_of_every_stage(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(MIXED)
    proc = _cli("policy", "check", str(f))
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"{f}: 5 problem(s)" in proc.stderr
    for line in (
        "providers.p.api_key: environment variable SY_TEST_UNSET_KEY is not set",
        "bogus: unknown field",
        "models.m2.price.input:",
        "routes.chat.targets[1].model: unknown model 'gpt-4x'",
        "cache.redis_url: required when cache.backend is 'redis'",
    ):
        assert line in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- simulate, no keys
DEFAULT = str(REPO / "policies" / "default.yaml")
HARD = {"messages": [{"role": "user", "content": "Prove there are infinitely many primes 4k+3."}]}


def test_cli_simulate_needs_no_provider_key_and_shows_the_classifier_decision() -> None:
    # the first embedding may make the session's one-time ONNX export (tests/conftest.py)
    proc = _cli(
        "policy", "simulate", DEFAULT, "--model", "auto", "--json", "--body", json.dumps(HARD), timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["simulated_keys_for"] == ["anthropic", "openai"]
    assert "no API key for anthropic, openai" in proc.stderr
    assert [t["model"] for t in out["targets"]][:2] == ["gpt-6-luna", "claude-haiku-5-5"]
    clf = out["classifier"]
    assert 0.0 <= clf["score"] <= 1.0 and clf["chosen_tier"] in ("strong", "cheap")
    expected = clf["strong"] if clf["score"] >= clf["threshold"] else clf["cheap"]
    assert clf["order"] == expected
    proc = _cli(
        "policy", "simulate", DEFAULT, "--model", "auto-quality", "--json", "--body", json.dumps(HARD)
    )
    assert proc.returncode == 0, proc.stderr
    clf = json.loads(proc.stdout)["classifier"]
    assert {p["model"] for p in clf["predictions"]} == {
        "gpt-5-nano", "gpt-5-mini", "claude-haiku-4-5", "gpt-5", "claude-sonnet-4-5",
    }  # fmt: skip
    assert clf["chosen"] == clf["order"][0]


def test_cli_simulate_with_a_key_simulates_nothing() -> None:
    proc = _cli(
        "policy", "simulate", DEFAULT, "--model", "chat-cheap", "--json", env={"OPENAI_API_KEY": "sk-x"}
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["simulated_keys_for"] == [] and out["skipped_providers_without_key"] == ["anthropic"]
    assert [t["model"] for t in out["targets"]] == ["gpt-6-luna", "gpt-5-nano"]
