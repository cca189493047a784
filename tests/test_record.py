"""``gateway.core.record``: frozen to the type checker, a plain slots dataclass at run time."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from mypy import api as mypy_api

from gateway.core.record import record
from gateway.core.types import Principal, Usage


@record
class _Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


def test_a_record_compares_hashes_and_replaces_like_a_frozen_dataclass() -> None:
    a, b = _Point(1, 2), _Point(1, 2)
    assert a == b and hash(a) == hash(b) and a != _Point(1, 3)
    assert {a: "one"}[b] == "one"
    assert dataclasses.replace(a, y=5) == _Point(1, 5) and a.y == 2
    assert repr(a) == "_Point(x=1, y=2, tags=())"
    assert not hasattr(a, "__dict__")  # slots: no per-instance dict
    assert hash(Principal("t", "k")) == hash(Principal("t", "k"))
    assert Usage(1, 2) == Usage(input_tokens=1, output_tokens=2)


def test_mypy_refuses_assigning_a_field_of_a_record(tmp_path: Path) -> None:
    src = tmp_path / "uses_record.py"
    src.write_text(
        textwrap.dedent(
            """
            from gateway.core.types import Usage

            u = Usage(1, 2)
            u.input_tokens = 3
            """
        )
    )
    out, _err, status = mypy_api.run(
        [str(src), "--strict", "--no-incremental", "--follow-imports=silent", "--cache-dir=/dev/null"]
    )
    assert status == 1, out
    assert 'Property "input_tokens" defined in "Usage" is read-only' in out
