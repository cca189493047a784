"""Compare two sets of ``load_tests.bench`` reports (e.g. a commit before a change and after,
run alternately in the same window): per scenario metric, the median gateway figure of each
set and their ratio.

    python -m load_tests.bench_compare BEFORE_DIR AFTER_DIR [--out DIR]

Each DIR holds ``bench-*.json`` files. Writes ``compare-<UTC>.json`` and ``.md`` under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from load_tests.bench import DEFAULT_OUT


def figures(folder: Path) -> dict[tuple[str, str], list[float]]:
    """(scenario, metric) -> the gateway figures of every report in ``folder``."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in sorted(folder.glob("bench-*.json")):
        for row in json.loads(path.read_text())["rows"]:
            if row.get("gateway") is not None:
                out.setdefault((row["scenario"], row["metric"]), []).append(float(row["gateway"]))
    return out


def compare(before: Path, after: Path) -> dict[str, Any]:
    a, b = figures(before), figures(after)
    rows = []
    for key in sorted(set(a) & set(b)):
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        rows.append({"scenario": key[0], "metric": key[1], "before": ma, "after": mb,
                     "ratio": mb / ma if ma else None, "runs": [len(a[key]), len(b[key])]})  # fmt: skip
    return {"before": str(before), "after": str(after), "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Gateway benchmark: before vs after (medians of the gateway figures)",
        "",
        f"- before: `{result['before']}`; after: `{result['after']}`",
        "- ratio = after / before (latency: lower is better; throughput: higher is better)",
        "",
        "| scenario | metric | before | after | ratio | runs |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = f"x{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        runs = f"{r['runs'][0]} / {r['runs'][1]}"
        lines.append(
            f"| {r['scenario']} | {r['metric']} | {r['before']:.3f} | {r['after']:.3f} | {ratio} | {runs} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.bench_compare")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    result = compare(args.before, args.after)
    if not result["rows"]:
        print("no common scenarios: are there bench-*.json files in both folders?", file=sys.stderr)
        return 2
    markdown = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (args.out / f"compare-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"compare-{stamp}.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
