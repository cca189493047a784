"""Process settings from the environment (the policy file holds everything else).

This module is the only reader (and writer) of ``os.environ`` in the gateway:

* ``Settings.from_env``: every ``SWITCHYARD_*`` variable, checked (a name it does not know is
  refused with the closest known one);
* ``default_home``: ``$SWITCHYARD_HOME`` or ``~/.switchyard``, computed here only;
* ``env_setting``: one ``SWITCHYARD_*`` value for a lower module that no caller hands its
  ``Settings`` (the embedder run from an offline tool);
* ``library_env`` / ``set_library_default``: process-wide variables of the libraries we use
  (``HF_HUB_OFFLINE``, ``TIKTOKEN_CACHE_DIR``, ``PROMETHEUS_MULTIPROC_DIR``);
* ``export_serve_environment``: what ``switchyard serve`` hands uvicorn's worker processes.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import gateway
from gateway.core.errors import SwitchyardError

PREFIX: Final = "SWITCHYARD_"

# Every SWITCHYARD_* variable Switchyard reads, with its Settings field and meaning.
VARIABLES: Final[Mapping[str, str]] = {
    "SWITCHYARD_HOME": "home: local state (keys.db, the SQLite ledger, models); default ~/.switchyard",
    "SWITCHYARD_POLICY": "policy_path: the policy YAML; default policies/default.yaml",
    "SWITCHYARD_ADMIN_KEY": "admin_key: guards /admin/* (unset: admin API closed)",
    "SWITCHYARD_LEDGER": "ledger_url: sqlite:///PATH, postgresql://... or none; default SQLite in home",
    "SWITCHYARD_CONVERSATION_SPANS": "1: keep the conversation spans (fast 30-day top conversations)",
    "SWITCHYARD_REDIS_URL": "redis_url: shared exact cache, semantic cache and limits",
    "SWITCHYARD_LOG_LEVEL": "log_level: critical, error, warning, info (default), debug",
    "SWITCHYARD_POLICY_WATCH_S": "policy_watch_s: seconds between policy-file checks; 0 off (default 2)",
    "SWITCHYARD_FASTPATH": "fastpath: 0/false/off routes hot paths through FastAPI (to measure it)",
    "SWITCHYARD_EMBEDDER": "embedder: auto (default), onnx or torch",
    "SWITCHYARD_MODEL_DIR": "model_dir: where models made at first use are cached; default home/models",
    "SWITCHYARD_OTLP_ENDPOINT": "otlp_endpoint: OTLP/HTTP traces endpoint (over the policy's)",
    "SWITCHYARD_VLLM_PYTHON": "vllm_python: interpreter with vLLM for `switchyard engine serve`",
    "SWITCHYARD_EXIT_ON_START_FAILURE": "1 (default): a start-up failing after the 2 s grace exits (code 3)",
}
# SWITCHYARD_* names that other programs read, so they are often in the same environment:
# accepted (never refused), not used by the gateway.
OTHER_PROGRAMS: Final[Mapping[str, str]] = {
    "SWITCHYARD_KEY": "a client's virtual key (README quickstart)",
    "SWITCHYARD_WORKERS": "deploy/compose: `serve --workers`",
    "SWITCHYARD_PORT": "deploy/compose: published port",
    "SWITCHYARD_BIND": "deploy/compose: published address",
    "SWITCHYARD_PROMETHEUS_URL": "deploy/compose: Grafana's Prometheus datasource",
    "SWITCHYARD_TOOLS_CACHE": "deploy/tools/fetch-helm.sh: download cache",
    "SWITCHYARD_TEST_PG": "tests: the PostgreSQL server",
    "SWITCHYARD_TEST_PG_OUTAGE": "tests: how the PostgreSQL outage is made",
    "SWITCHYARD_BENCH_PG": "load_tests/ledger_bench.py: the PostgreSQL server",
}
EMBEDDERS: Final = ("auto", "onnx", "torch")
MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multi-process mode


class SettingsError(SwitchyardError):
    """The environment cannot be used: an unknown ``SWITCHYARD_*`` name or a bad value.
    Raised at start-up (``switchyard`` prints it and exits 2)."""

    status = 500
    type = "server_error"
    code = "invalid_settings"


def default_policy_path() -> Path:
    """``policies/default.yaml``: from the source tree, or the copy bundled in the wheel."""
    pkg = Path(gateway.__file__).resolve().parent
    for candidate in (pkg.parent / "policies" / "default.yaml", pkg / "_policies" / "default.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("policies/default.yaml is missing from this installation")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def configured_home(env: Mapping[str, str] | None = None) -> Path | None:
    """``$SWITCHYARD_HOME`` when it is set (and not empty), else None."""
    home = _env(env).get("SWITCHYARD_HOME")
    return Path(home).expanduser() if home else None


def default_home(env: Mapping[str, str] | None = None) -> Path:
    """The state directory: ``$SWITCHYARD_HOME``, else ``~/.switchyard`` (the one place this
    default is computed)."""
    return configured_home(env) or Path.home() / ".switchyard"


def env_setting(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """One ``SWITCHYARD_*`` value (empty = unset), for a module that no caller hands its
    ``Settings`` value. Only names of ``VARIABLES``."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a Switchyard setting")
    return _env(env).get(name) or None


def library_env(name: str) -> str | None:
    """A process-wide variable of a library we use (``TIKTOKEN_CACHE_DIR``, ...); empty = unset."""
    return os.environ.get(name) or None


def set_library_default(name: str, value: str) -> str:
    """Set a library's process-wide variable unless it is set already (``HF_HUB_OFFLINE=1``,
    ``TIKTOKEN_CACHE_DIR``); returns the value in force."""
    if name.upper().startswith(PREFIX):
        raise ValueError(f"{name} is a Switchyard setting, not a library variable")
    return os.environ.setdefault(name, value)


def export_serve_environment(policy: str | None, log_level: str, workers: int) -> None:
    """What ``switchyard serve`` hands uvicorn's worker processes, which build their own
    ``Settings.from_env()``: the policy file (made absolute), the log level and, with several
    workers, a ``PROMETHEUS_MULTIPROC_DIR`` through which their metrics are merged."""
    if policy:
        os.environ["SWITCHYARD_POLICY"] = str(Path(policy).resolve())
    os.environ["SWITCHYARD_LOG_LEVEL"] = log_level
    if workers > 1 and not os.environ.get(MULTIPROC_ENV):
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="switchyard-metrics-")


def check_names(env: Mapping[str, str]) -> None:
    """Refuse every ``SWITCHYARD_*`` name (any case) that is neither a setting nor another
    program's variable, naming the closest known one."""
    known = [*VARIABLES, *OTHER_PROGRAMS]
    unknown = sorted(k for k in env if k.upper().startswith(PREFIX) and k not in known)
    if not unknown:
        return
    suffixes = {k[len(PREFIX) :]: k for k in known}  # compared without the shared prefix
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper()[len(PREFIX) :], suffixes, n=1, cutoff=0.6)
        problems.append(f"{name} (did you mean {suffixes[close[0]]}?)" if close else name)
    noun = "variable" if len(unknown) == 1 else "variables"
    raise SettingsError(
        f"unknown environment {noun} {'; '.join(problems)}. Switchyard reads: {', '.join(VARIABLES)}",
        param=unknown[0],
    )


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number", param=name) from None


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = (env.get(name) or ("1" if default else "0")).strip().lower()
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no", ""):
        return False
    raise SettingsError(f"{name}={raw!r}: expected 1 or 0", param=name)


class Secret:
    """A string whose repr/str never shows the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    policy_path: Path
    admin_key: Secret | None
    ledger_url: str
    redis_url: str | None
    log_level: str
    policy_watch_s: float = 2.0  # 0 disables watching the policy file for changes
    fastpath: bool = True  # dispatch hot routes without FastAPI's middleware (0: off, to measure it)
    embedder: str = "auto"  # auto | onnx | torch
    model_dir: Path | None = None  # None: <home>/models
    otlp_endpoint: str | None = None  # None: the policy's telemetry.otlp_endpoint
    vllm_python: str | None = None  # read by engine.cli itself (the engine imports nothing of ours)
    multiprocess_dir: str | None = None  # PROMETHEUS_MULTIPROC_DIR: set when serving N workers
    conversation_spans: bool = False  # keep ledger/spans.py's table (the 30-day top conversations)
    # A start-up failing after app.START_GRACE_S: exit with uvicorn's STARTUP_FAILURE code (3), as
    # one failing inside the grace does; False (embedded gateways, tests): stay up answering 503.
    exit_on_start_failure: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = _env(env)
        check_names(env)
        home = default_home(env)
        policy = env.get("SWITCHYARD_POLICY")
        admin = env.get("SWITCHYARD_ADMIN_KEY")
        embedder = env.get("SWITCHYARD_EMBEDDER") or "auto"
        if embedder not in EMBEDDERS:
            raise SettingsError(
                f"SWITCHYARD_EMBEDDER={embedder!r}: expected one of {', '.join(EMBEDDERS)}",
                param="SWITCHYARD_EMBEDDER",
            )
        model_dir = env.get("SWITCHYARD_MODEL_DIR")
        return cls(
            home=home,
            policy_path=Path(policy).expanduser() if policy else default_policy_path(),
            admin_key=Secret(admin) if admin else None,
            ledger_url=env.get("SWITCHYARD_LEDGER") or f"sqlite:///{home / 'ledger.db'}",
            redis_url=env.get("SWITCHYARD_REDIS_URL") or None,
            log_level=env.get("SWITCHYARD_LOG_LEVEL", "info"),
            policy_watch_s=_float(env, "SWITCHYARD_POLICY_WATCH_S", 2.0),
            fastpath=env.get("SWITCHYARD_FASTPATH", "1") not in ("0", "false", "off"),
            embedder=embedder,
            model_dir=Path(model_dir).expanduser() if model_dir else None,
            otlp_endpoint=env.get("SWITCHYARD_OTLP_ENDPOINT") or None,
            vllm_python=env.get("SWITCHYARD_VLLM_PYTHON") or None,
            multiprocess_dir=env.get(MULTIPROC_ENV) or None,
            conversation_spans=_flag(env, "SWITCHYARD_CONVERSATION_SPANS"),
            exit_on_start_failure=_flag(env, "SWITCHYARD_EXIT_ON_START_FAILURE", default=True),
        )

    @property
    def keys_db(self) -> Path:
        return self.home / "keys.db"
