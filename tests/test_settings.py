"""Settings: the one reader of the environment. A SWITCHYARD_* name it does not know stops
start-up with the closest known one; every documented variable (and every one this repo's
tests, load tests, deploy files and README set) is accepted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import settings as settings_mod
from gateway.config.settings import (
    OTHER_PROGRAMS,
    VARIABLES,
    Settings,
    SettingsError,
    configured_home,
    default_home,
    env_setting,
    export_serve_environment,
    set_library_default,
)
from gateway.core.errors import SwitchyardError

REPO = Path(__file__).resolve().parent.parent


def test_an_unknown_variable_is_refused_with_the_closest_name() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SWITCHYARD_LEDGR": "none"})
    err = info.value
    assert "SWITCHYARD_LEDGR (did you mean SWITCHYARD_LEDGER?)" in err.message
    assert err.param == "SWITCHYARD_LEDGR"
    assert isinstance(err, SwitchyardError)
    assert (err.status, err.type, err.code) == (500, "server_error", "invalid_settings")
    assert err.to_body()["error"]["code"] == "invalid_settings"


def test_every_unknown_name_is_listed_any_case() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(
            {"SWITCHYARD_REDIS": "redis://x", "switchyard_home": "/tmp/x", "SWITCHYARD_ZZZZZZZZ": "1"}
        )
    msg = info.value.message
    assert msg.startswith("unknown environment variables ")
    assert "SWITCHYARD_REDIS (did you mean SWITCHYARD_REDIS_URL?)" in msg
    assert "switchyard_home (did you mean SWITCHYARD_HOME?)" in msg
    assert "; SWITCHYARD_ZZZZZZZZ; " in msg  # nothing close to suggest
    assert "Switchyard reads: SWITCHYARD_HOME, " in msg


def test_other_names_are_not_checked() -> None:
    s = Settings.from_env({"OPENAI_API_KEY": "sk-x", "MY_SWITCHYARD_THING": "1", "SWITCHYARD": "1"})
    assert s.log_level == "info"


def test_every_documented_variable_is_accepted(tmp_path: Path) -> None:
    env = {
        "SWITCHYARD_HOME": str(tmp_path / "home"),
        "SWITCHYARD_POLICY": str(tmp_path / "p.yaml"),
        "SWITCHYARD_ADMIN_KEY": "admin-key-0123456789abcdef",
        "SWITCHYARD_LEDGER": "none",
        "SWITCHYARD_CONVERSATION_SPANS": "1",
        "SWITCHYARD_REDIS_URL": "redis://127.0.0.1:6379/0",
        "SWITCHYARD_LOG_LEVEL": "debug",
        "SWITCHYARD_POLICY_WATCH_S": "0.5",
        "SWITCHYARD_FASTPATH": "off",
        "SWITCHYARD_EMBEDDER": "torch",
        "SWITCHYARD_MODEL_DIR": str(tmp_path / "models"),
        "SWITCHYARD_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/traces",
        "SWITCHYARD_VLLM_PYTHON": "/opt/vllm/bin/python",
        "SWITCHYARD_EXIT_ON_START_FAILURE": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp"),
    }
    assert set(VARIABLES) == {k for k in env if k.startswith("SWITCHYARD_")}, "a test value per variable"
    s = Settings.from_env({**env, **dict.fromkeys(OTHER_PROGRAMS, "x")})
    assert s.home == tmp_path / "home" and s.policy_path == tmp_path / "p.yaml"
    assert s.admin_key is not None and s.admin_key.get() == env["SWITCHYARD_ADMIN_KEY"]
    assert (s.ledger_url, s.redis_url, s.log_level) == ("none", env["SWITCHYARD_REDIS_URL"], "debug")
    assert (s.policy_watch_s, s.fastpath, s.embedder) == (0.5, False, "torch")
    assert s.model_dir == tmp_path / "models"
    assert s.otlp_endpoint == env["SWITCHYARD_OTLP_ENDPOINT"]
    assert s.vllm_python == "/opt/vllm/bin/python"
    assert s.multiprocess_dir == str(tmp_path / "mp")
    assert s.conversation_spans is True
    assert s.exit_on_start_failure is False


def test_conversation_spans_flag_is_checked() -> None:
    assert Settings.from_env({}).conversation_spans is False
    assert Settings.from_env({}).exit_on_start_failure is True  # a process of its own exits
    assert Settings.from_env({"SWITCHYARD_CONVERSATION_SPANS": "off"}).conversation_spans is False
    with pytest.raises(SettingsError, match="SWITCHYARD_CONVERSATION_SPANS"):
        Settings.from_env({"SWITCHYARD_CONVERSATION_SPANS": "maybe"})


def test_defaults_without_any_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    s = Settings.from_env({})
    assert s.home == tmp_path / ".switchyard" == default_home({})
    assert s.ledger_url == f"sqlite:///{tmp_path / '.switchyard' / 'ledger.db'}"
    assert (s.embedder, s.model_dir, s.otlp_endpoint, s.multiprocess_dir) == ("auto", None, None, None)
    assert configured_home({}) is None and configured_home({"SWITCHYARD_HOME": "~/sy"}) == tmp_path / "sy"


SET_IN_REPO = re.compile(r"\bSWITCHYARD_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_name_this_repo_sets_is_known() -> None:
    """tests/, load_tests/, deploy/ (helm, compose, Dockerfile) and the README never use a name
    that `switchyard serve` would refuse."""
    files = [
        REPO / "README.md",
        *(p for d in ("tests", "load_tests", "deploy") for p in (REPO / d).rglob("*")),
    ]
    seen: dict[str, Path] = {}
    for path in files:
        skip = path == Path(__file__) or ".cache" in path.parts  # this file misspells on purpose
        if skip or not path.is_file() or path.suffix in (".png", ".gz", ".npz", ".pyc"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for name in SET_IN_REPO.findall(text):
            seen.setdefault(name, path)
    assert {"SWITCHYARD_HOME", "SWITCHYARD_LEDGER", "SWITCHYARD_TEST_PG"} <= set(seen)
    unknown = {
        n: str(p.relative_to(REPO)) for n, p in seen.items() if n not in VARIABLES and n not in OTHER_PROGRAMS
    }
    assert not unknown, f"add these to config.settings.VARIABLES or OTHER_PROGRAMS: {unknown}"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SWITCHYARD_EMBEDDER", "gpu", "SWITCHYARD_EMBEDDER='gpu': expected one of auto, onnx, torch"),
        ("SWITCHYARD_POLICY_WATCH_S", "soon", "SWITCHYARD_POLICY_WATCH_S='soon' is not a number"),
    ],
)
def test_a_bad_value_is_a_settings_error(name: str, value: str, says: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(says)):
        Settings.from_env({name: value})


def test_helpers_take_only_their_kind_of_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_EMBEDDER", "onnx")
    assert env_setting("SWITCHYARD_EMBEDDER") == "onnx"
    assert env_setting("SWITCHYARD_EMBEDDER", {"SWITCHYARD_EMBEDDER": ""}) is None
    with pytest.raises(KeyError):
        env_setting("SWITCHYARD_EMBEDDERS")
    with pytest.raises(ValueError, match="is a Switchyard setting"):
        set_library_default("SWITCHYARD_HOME", "/tmp")
    monkeypatch.setenv("SY_TEST_LIBRARY_VAR", "kept")
    assert set_library_default("SY_TEST_LIBRARY_VAR", "other") == "kept"


def test_export_serve_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SWITCHYARD_POLICY", "SWITCHYARD_LOG_LEVEL", "PROMETHEUS_MULTIPROC_DIR"):
        monkeypatch.setenv(name, "")  # restored by monkeypatch afterwards
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    export_serve_environment("p.yaml", "warning", 1)
    assert os.environ["SWITCHYARD_POLICY"] == str(tmp_path / "p.yaml")
    assert os.environ["SWITCHYARD_LOG_LEVEL"] == "warning"
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == ""  # one worker: no multi-process metrics
    export_serve_environment(None, "info", 4)
    assert os.environ["SWITCHYARD_POLICY"] == str(tmp_path / "p.yaml")
    mp = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert mp.parent == tmp_path and mp.name.startswith("switchyard-metrics-") and mp.is_dir()
    assert Settings.from_env().multiprocess_dir == str(mp)


def test_the_cli_exits_2_with_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHYARD_ADMN_KEY", "x")
    assert main(["keys", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("switchyard: error: unknown environment variable SWITCHYARD_ADMN_KEY")
    assert "did you mean SWITCHYARD_ADMIN_KEY?" in err


def test_serve_with_a_misspelled_variable_exits_2_without_a_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(HOME=str(tmp_path), SWITCHYARD_HOME=str(tmp_path / "home"), SWITCHYARD_LEDGR="none")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("switchyard: error: unknown environment variable SWITCHYARD_LEDGR")
    assert "(did you mean SWITCHYARD_LEDGER?)" in proc.stderr
    assert not (tmp_path / "home").exists()


def test_settings_module_is_the_one_place_home_is_defaulted() -> None:
    """`~/.switchyard` is spelled once in gateway/ (config/settings.py's default_home)."""
    hits = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "gateway").rglob("*.py"))
        if 'Path.home() / ".switchyard"' in p.read_text(encoding="utf-8")
    ]
    assert hits == ["gateway/config/settings.py"]
    assert settings_mod.default_home.__doc__ and "one place" in settings_mod.default_home.__doc__
