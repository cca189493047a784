"""Process settings from the environment (the policy file holds everything else)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import gateway


def default_policy_path() -> Path:
    """``policies/default.yaml``: from the source tree, or the copy bundled in the wheel."""
    pkg = Path(gateway.__file__).resolve().parent
    for candidate in (pkg.parent / "policies" / "default.yaml", pkg / "_policies" / "default.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("policies/default.yaml is missing from this installation")


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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        home = Path(env.get("SWITCHYARD_HOME") or Path.home() / ".switchyard").expanduser()
        policy = env.get("SWITCHYARD_POLICY")
        admin = env.get("SWITCHYARD_ADMIN_KEY")
        return cls(
            home=home,
            policy_path=Path(policy).expanduser() if policy else default_policy_path(),
            admin_key=Secret(admin) if admin else None,
            ledger_url=env.get("SWITCHYARD_LEDGER") or f"sqlite:///{home / 'ledger.db'}",
            redis_url=env.get("SWITCHYARD_REDIS_URL") or None,
            log_level=env.get("SWITCHYARD_LOG_LEVEL", "info"),
            policy_watch_s=float(env.get("SWITCHYARD_POLICY_WATCH_S") or 2.0),
            fastpath=env.get("SWITCHYARD_FASTPATH", "1") not in ("0", "false", "off"),
        )

    @property
    def keys_db(self) -> Path:
        return self.home / "keys.db"
