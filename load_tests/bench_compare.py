"""Compare two sets of ``load_tests.bench`` reports (e.g. a commit before a change and after,
run alternately in the same window): per scenario metric, the median gateway figure of each
set and their ratio.

    python -m load_tests.bench_compare BEFORE_DIR AFTER_DIR [--out DIR]
    python -m load_tests.bench_compare --commits OLD [NEW] [--runs 3] [--full] [--out DIR]

Each DIR holds ``bench-*.json`` files. With ``--commits`` it checks OLD (and NEW, default: this
working tree as it is) out as temporary git worktrees and runs this tree's ``python -m
load_tests.bench --quick --gateway-root TREE`` on each gateway, alternately, ``--runs`` times,
so both see the same machine and the same harness (floor, CPU per request, RSS); then compares.
Writes ``compare-<UTC>.json`` and ``.md`` under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from load_tests.bench import DEFAULT_OUT
from load_tests.bench_procs import ROOT


def figures(folder: Path) -> dict[tuple[str, str], list[float]]:
    """(scenario, metric) -> the gateway figures of every report in ``folder`` (for the
    throughput / floor rows: gateway / floor of each run)."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in sorted(folder.glob("bench-*.json")):
        for row in json.loads(path.read_text())["rows"]:
            # a "throughput / floor" row: the ratio measured in that run (the floor beside it)
            value = row.get("ratio") if row["metric"].endswith("/ floor") else row.get("gateway")
            if value is not None:
                out.setdefault((row["scenario"], row["metric"]), []).append(float(value))
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


def _bench_in(tree: Path, out: Path, full: bool) -> None:
    """One ``load_tests.bench`` run (this tree's harness) of ``tree``'s gateway."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "load_tests.bench", "--out", str(out), "--gateway-root", str(tree)]
    cmd += [] if full else ["--quick"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=False, stdout=subprocess.DEVNULL, timeout=1800)


def bench_commits(old: str, new: str | None, runs: int, full: bool, work: Path) -> tuple[Path, Path]:
    """Worktrees of ``old`` (and ``new``; None: this working tree), benched alternately."""
    trees: list[Path] = []
    try:
        sides: list[tuple[str, Path]] = []
        for label, commit in (("before", old), ("after", new)):
            if commit is None:
                sides.append((label, ROOT))
                continue
            tree = work / f"tree-{label}"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                           check=True, capture_output=True)  # fmt: skip
            trees.append(tree)
            sides.append((label, tree))
        for i in range(runs):
            for label, tree in sides if i % 2 == 0 else sides[::-1]:
                print(f"run {i + 1}/{runs}: {label} ({tree})", flush=True)
                _bench_in(tree, work / label, full)
    finally:
        for tree in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    return work / "before", work / "after"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.bench_compare")
    p.add_argument("before", type=Path, nargs="?")
    p.add_argument("after", type=Path, nargs="?")
    p.add_argument("--commits", nargs="+", metavar="COMMIT", help="OLD [NEW]: bench worktrees of these")
    p.add_argument("--runs", type=int, default=3, help="alternating runs per side (--commits)")
    p.add_argument("--full", action="store_true", help="full bench runs instead of --quick (--commits)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.commits:
        if len(args.commits) > 2:
            p.error("--commits takes OLD [NEW]")
        work = Path(tempfile.mkdtemp(prefix="switchyard-compare-"))
        new = args.commits[1] if len(args.commits) == 2 else None
        args.before, args.after = bench_commits(args.commits[0], new, max(1, args.runs), args.full, work)
    elif args.before is None or args.after is None:
        p.error("give BEFORE_DIR AFTER_DIR, or --commits OLD [NEW]")
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
