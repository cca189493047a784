"""Load a policy file: YAML -> ${ENV} substitution -> schema -> cross-references.

Every problem is reported with its YAML path, all at once, so `switchyard policy check` can
print them together. Secrets substituted from the environment never appear in messages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import ValidationError

from gateway.config.catalog import resolve_prices
from gateway.config.policy import Policy
from gateway.core.errors import SwitchyardError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


class PolicyError(SwitchyardError):
    """A policy that cannot be used; ``problems`` lists (yaml path, message). ``str()`` is the
    report for a terminal; ``to_body()`` the 422 a failed ``/admin/policy/reload`` answers."""

    status = 422
    type = "invalid_request_error"
    code = "invalid_policy"
    BODY_MESSAGE: ClassVar[str] = "The policy file has errors; the running policy was kept"

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += [f"  {path}: {msg}" if path else f"  {msg}" for path, msg in self.problems]
        return "\n".join(lines)

    def to_body(self) -> dict[str, object]:
        error = {"message": self.BODY_MESSAGE, "type": self.type, "param": None, "code": self.code}
        problems = [{"path": path, "message": msg} for path, msg in self.problems]
        return {"error": {**error, "problems": problems}}


def yaml_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _substitute(
    node: Any,
    env: Mapping[str, str],
    path: tuple[int | str, ...],
    missing: list[tuple[str, str]],
    used: dict[str, list[tuple[str, str]]],
) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, env, (*path, str(k)), missing, used) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, env, (*path, i), missing, used) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node

    def repl(m: re.Match[str]) -> str:
        name, has_default, default = m.group(1), m.group(2), m.group(3)
        value = env.get(name)
        if value is None or (value == "" and has_default):
            if has_default is not None:
                return default or ""
            missing.append((yaml_path(path), f"environment variable {name} is not set"))
            return ""
        if value:
            used.setdefault(yaml_path(path), []).append((name, value))
        return value

    return _ENV_REF.sub(repl, node)


def _hide_env_values(
    problems: list[tuple[str, str]], used: Mapping[str, list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    """Messages about a field that took a value from the environment show ``${NAME}`` instead
    of the value (a cross reference quotes the value it could not resolve; it may be a key)."""
    out = []
    for path, msg in problems:
        for where, refs in used.items():
            if path == where or path.startswith((where + ".", where + "[")):
                for name, value in sorted(refs, key=lambda r: len(r[1]), reverse=True):
                    msg = msg.replace(value, "${" + name + "}")
        out.append((path, msg))
    return out


def parse_policy(
    text: str,
    source: str = "<policy>",
    env: Mapping[str, str] | None = None,
    *,
    base_dir: Path | None = None,  # for relative paths in the policy (price_calibration)
) -> Policy:
    env = os.environ if env is None else env
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(source, [("", f"invalid YAML: {where}{problem}")]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PolicyError(source, [("", "the policy must be a YAML mapping")])
    missing: list[tuple[str, str]] = []
    used: dict[str, list[tuple[str, str]]] = {}  # yaml path -> [(variable, value)] from env
    data = _substitute(raw, env, (), missing, used)
    at_missing = {path for path, _ in missing}
    policy, problems = _validate(data, at_missing)
    problems = [*missing, *(p for p in problems if not _under(p[0], at_missing))]
    if policy is not None and not problems:  # prices need valid provider references
        policy, problems = resolve_prices(policy, base_dir)
    if problems or policy is None:
        raise PolicyError(source, _hide_env_values(problems, used))
    return policy


_MAX_SALVAGE = 20  # re-validations while pruning bad entries (each pass drops at least one)


def _under(path: str, roots: set[str]) -> bool:
    return any(path == r or path.startswith((r + ".", r + "[")) for r in roots)


def _schema_problems(exc: ValidationError, skip: set[str]) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        path = yaml_path(tuple(err["loc"]))
        if _under(path, skip):
            continue  # a missing variable already reported there
        out.append((path, "unknown field" if err["type"] == "extra_forbidden" else err["msg"]))
    return out


def _validate(data: Any, missing: set[str]) -> tuple[Policy | None, list[tuple[str, str]]]:
    """The policy and every problem in one pass: the schema's, then the cross references of
    what is left once the bad entries are set aside (a route is still checked when one model
    is malformed; a reference to a set-aside entry is not reported a second time)."""
    try:
        return _checked(Policy.model_validate(data), set())
    except ValidationError as exc:
        problems = _schema_problems(exc, missing)
        first = exc
    pruned, dropped = data, set()
    err: ValidationError | None = first
    for _ in range(_MAX_SALVAGE):
        assert err is not None
        pruned, removed = _prune(pruned, err)
        if not removed:
            break
        dropped |= removed
        try:
            policy = Policy.model_validate(pruned)
        except ValidationError as again:
            err = again
            continue
        _, refs = _checked(policy, dropped)
        return None, [*problems, *(p for p in refs if p not in problems)]
    if not problems:  # only errors at missing variables: say so rather than nothing
        problems = _schema_problems(first, set())
    return None, problems


def _checked(policy: Policy, dropped: set[str]) -> tuple[Policy, list[tuple[str, str]]]:
    names = {d.rpartition(".")[2] for d in dropped}
    refs = [
        (path, msg)
        for path, msg in policy.cross_reference_errors()
        if not any(f"'{n}'" in msg for n in names)
    ]
    return policy, refs


_SECTIONS = ("providers", "models", "routes", "tenants", "aliases")  # named entries


def _prune(data: Any, exc: ValidationError) -> tuple[Any, set[str]]:
    """``data`` without the entries the errors point into: a named entry of a section
    (``models.foo``), or a whole top-level key (which then takes its default)."""
    if not isinstance(data, dict):
        return data, set()
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    removed: set[str] = set()
    for err in exc.errors(include_url=False, include_input=False):
        loc = tuple(err["loc"])
        if not loc or not isinstance(loc[0], str):
            continue
        top = loc[0]
        if top in _SECTIONS and len(loc) > 1 and isinstance(out.get(top), dict) and loc[1] in out[top]:
            del out[top][loc[1]]
            removed.add(f"{top}.{loc[1]}")
        elif top in out:
            del out[top]
            removed.add(top)
    return out, removed


def load_policy(path: Path, env: Mapping[str, str] | None = None) -> Policy:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(str(path), [("", f"cannot read policy file: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError:
        raise PolicyError(str(path), [("", "policy file is not valid UTF-8")]) from None
    return parse_policy(text, str(path), env, base_dir=path.parent)
