"""What the small benchmark commands share: their common arguments and how a report is saved
(``<name>-<UTC stamp>.json`` with the raw figures beside ``.md`` with the table)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

REPORTS = Path(__file__).parent / "reports"


def bench_parser(doc: str | None, runs: int = 3, seconds: float | None = 4.0) -> argparse.ArgumentParser:
    """``--runs`` (alternated, medians), ``--seconds`` per measured run (None: no such
    option) and ``--out``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=runs, help="alternated runs (medians)")
    if seconds is not None:
        parser.add_argument("--seconds", type=float, default=seconds, help="measured seconds per run")
    parser.add_argument("--out", type=Path, default=REPORTS)
    return parser


def save_report(out: Path, name: str, payload: dict[str, Any], lines: list[str]) -> None:
    """Write ``payload`` (JSON) and ``lines`` (Markdown) under ``out``, and print the table."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"{name}-{stamp}.json").write_text(json.dumps(payload, indent=2))
    (out / f"{name}-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
