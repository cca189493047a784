"""Where an auto request's CPU goes: the auto path's stages one by one, and the gateway's threads.

    python -m load_tests.auto_itemize [--prompts 400] [--entries 2000] [--runs 3]
                                      [--seconds 6] [--out DIR]

*Stages* (in process, one thread pinned to one core): the auto path's own work on the bench's
prompts (``load_tests.auto_path``: every prompt new), stage after stage in the order a request
runs them, so each stage finds the caches the one before left, as in the gateway: the semantic
key, the tokenizer, the ONNX Runtime run, pooling, the cache lookup (and, measured apart just
before it, the query's analysis and the faiss search), the classifier (and its text features),
the store (and, apart, the payload's compression). The semantic cache starts with ``--entries``
entries in the prompts' partition and grows by one per prompt. Thread CPU time per call
(``time.thread_time_ns``; its own cost, ~1 us here, is in each figure), medians over prompts,
then over ``--runs``.

*Threads* (``--seconds`` > 0): the closed loop of ``load_tests.auto_path`` (32 clients, one
gateway worker pinned to CPU 0) on the plain and the auto route, alternated ``--runs`` times;
CPU per request of each of the gateway's threads and their context switches, from /proc. The
event loop's thread is the process' main thread; on the auto route the busiest other one is the
embedder's worker (the model runs there, off the loop). JSON + Markdown under DIR (default
load_tests/reports/auto-itemize-*)."""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gateway.cache import embed_backends as eb
from gateway.cache.semantic import SemanticCache, pack
from gateway.cache.semantic_key import semantic_key
from gateway.cache.verifier import analyse, load_verifier, rule_key
from gateway.routing.classifier import ComplexityClassifier
from gateway.routing.features import text_features
from load_tests.auto_path import POLICY, one, prompt, reuse_models, warm
from load_tests.bench_procs import MockProcess, machine_info, pin_tree, tree_pids
from load_tests.mock_upstream import new_event_loop
from load_tests.report_files import bench_parser, save_report
from load_tests.scenarios.served import ServedGateway

PAYLOAD = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"mock-small","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"' + b"A short mock answer. " * 12 + b'"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":60,"total_tokens":90}}'
)
STAGES = (
    "semantic key", "tokenizer", "ORT run", "pooling", "lookup", "  of which query analysis",
    "  of which faiss search", "classifier", "  of which text features", "store",
    "  of which payload compression",
)  # fmt: skip
TOP_LEVEL = tuple(s for s in STAGES if not s.startswith(" "))


def body(text: str) -> dict[str, Any]:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}


class Stages:
    """The auto path's parts, built as the gateway builds them, and a timer per stage."""

    def __init__(self, entries: int, seed: int) -> None:
        source, path = eb.onnx_source(Path(os.environ.get("SWITCHYARD_HOME", Path.home() / ".switchyard")))
        self.session = eb.onnx_session(source, path)
        self.tokenize = eb.batch_tokenizer(eb.load_tokenizer())
        self.cache = SemanticCache(load_verifier())
        self.classifier = ComplexityClassifier.load()
        self.times: dict[str, list[int]] = {s: [] for s in STAGES}
        texts = [prompt(i, seed) for i in range(entries)]
        self.context = self._key(texts[0] if texts else prompt(0, seed)).context
        for text in texts:
            self.cache.insert(self.context, text, self._embed(text), PAYLOAD, 3600.0)

    def _key(self, text: str) -> Any:
        key = semantic_key("tenant", "auto", body(text), "chat")
        assert key is not None
        return key

    def _embed(self, text: str) -> Any:
        hidden = self.session.run(None, eb.onnx_feeds(self.tokenize([text])[0].ids))[0]
        return eb._normalise(hidden[0].mean(axis=0)[None, :])[0]

    def timed(self, stage: str, fn: Callable[[], Any]) -> Any:
        t0 = time.thread_time_ns()
        out = fn()
        self.times[stage].append(time.thread_time_ns() - t0)
        return out

    def request(self, text: str) -> None:
        """One auto request's own work, stage by stage (the gateway's order)."""
        key = self.timed("semantic key", lambda: self._key(text))
        enc = self.timed("tokenizer", lambda: self.tokenize([key.text])[0])
        hidden = self.timed("ORT run", lambda: self.session.run(None, eb.onnx_feeds(enc.ids))[0])
        vec = self.timed("pooling", lambda: eb._normalise(hidden[0].mean(axis=0)[None, :])[0])
        self.timed("  of which query analysis", lambda: rule_key(analyse(text)))
        part = self.cache.partition(key.context)
        if part is not None:
            self.timed("  of which faiss search", lambda: part.search(vec, self.cache.candidates))
        found = self.timed("lookup", lambda: self.cache.lookup(key.context, key.text, vec))
        self.timed("  of which text features", lambda: text_features(text))
        self.timed("classifier", lambda: self.classifier.score(vec, text))
        self.timed("  of which payload compression", lambda: pack(PAYLOAD))
        self.timed(
            "store", lambda: self.cache.insert(key.context, key.text, vec, PAYLOAD, 3600.0, found.rules)
        )


def stage_run(prompts: int, entries: int, run: int) -> dict[str, float]:
    """Median microseconds per call of each stage over ``prompts`` new prompts."""
    st = Stages(entries, seed=10_000 + run)
    for i in range(prompts):
        st.request(prompt(i, 20_000 + run))
    st.cache.close()
    return {s: statistics.median(v) / 1000 for s, v in st.times.items() if v}


def thread_cpu(pid: int) -> dict[int, tuple[float, int, int]]:
    """tid -> (CPU seconds, voluntary, involuntary context switches) of each thread."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[float, int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
        except OSError:
            continue  # the thread ended meanwhile
        ctx = [int(line.split()[1]) for line in status if "ctxt_switches" in line]
        out[int(tid)] = ((int(fields[11]) + int(fields[12])) / tick, ctx[0], ctx[1])
    return out


def thread_run(gw: ServedGateway, pid: int, route: str, seconds: float, seed: int) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        before = thread_cpu(pid)
        rep = loop.run_until_complete(one(gw, route, "closed", 32, seconds, seed))
        after = thread_cpu(pid)
    finally:
        loop.close()
    n = max(rep.ok, 1)
    rows: list[tuple[str, float, float, float]] = []
    for tid, (cpu, vol, invol) in after.items():
        cpu0, vol0, invol0 = before.get(tid, (0.0, 0, 0))
        if cpu > cpu0 or vol > vol0:
            name = "event loop" if tid == pid else str(tid)
            rows.append((name, (cpu - cpu0) * 1000 / n, (vol - vol0) / n, (invol - invol0) / n))
    rows.sort(key=lambda r: (r[0] != "event loop", -r[1]))
    named = [{"thread": t, "cpu_ms": c, "voluntary": v, "involuntary": i} for t, c, v, i in rows]
    return {"route": route, "req_s": rep.achieved_rps, "ok": rep.ok, "errors": rep.errors, "threads": named}


def threads(runs: int, seconds: float) -> list[dict[str, Any]]:
    pinned = (os.cpu_count() or 1) >= 2
    mock = MockProcess.start({1} if pinned else None)
    out: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="sy-itemize-") as tmp:
            home = Path(tmp) / "home"
            reuse_models(home)
            with ServedGateway(home, POLICY.format(mock_url=mock.url), args=["--workers", "1"]) as gw:
                if pinned:
                    pin_tree(gw.pid, {0})
                warm(gw)
                pid = tree_pids(gw.pid)[-1]  # the serving process
                for run in range(runs):
                    for route in ("plain", "auto") if run % 2 == 0 else ("auto", "plain"):
                        out.append(thread_run(gw, pid, route, seconds, 100 * run + len(out)))
    finally:
        mock.stop()
    return out


def markdown(report: dict[str, Any]) -> list[str]:
    stages: list[dict[str, float]] = report["stages"]
    med = {s: statistics.median(r[s] for r in stages) for s in STAGES if all(s in r for r in stages)}
    total = sum(med[s] for s in TOP_LEVEL if s in med)
    lines = [
        f"# The auto path itemized ({report['started']})",
        "",
        f"Machine: {report['machine']}. Stages: {report['prompts']} new prompts per run after "
        f"{report['entries']} entries, medians per call over prompts, then over {len(stages)} runs.",
        "",
        "| stage | us per request | share |",
        "| --- | --- | --- |",
        *(
            f"| {s} | {v:.1f} | {'' if s.startswith(' ') else f'{100 * v / total:.0f}%'} |"
            for s, v in med.items()
        ),
        f"| **total (top-level stages)** | {total:.1f} | 100% |",
    ]
    if report["threads"]:
        lines += [
            "",
            "Through the gateway (closed loop, 32 clients): CPU ms per request of each thread, and its "
            "context switches per request (voluntary/involuntary):",
            "",
            "| run | route | req/s | threads |",
            "| --- | --- | --- | --- |",
        ]
        for i, r in enumerate(report["threads"]):
            cells = "; ".join(
                f"{t['thread']} {t['cpu_ms']:.3f} ({t['voluntary']:.2f}/{t['involuntary']:.2f})"
                for t in r["threads"]
            )
            lines.append(f"| {i + 1} | {r['route']} | {r['req_s']:.0f} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, runs=3, seconds=6.0)
    p.add_argument("--prompts", type=int, default=400, help="new prompts per stage run")
    p.add_argument("--entries", type=int, default=2000, help="cache entries before the first prompt")
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    stages = [stage_run(args.prompts, args.entries, run) for run in range(args.runs)]
    report = {
        "started": started,
        "machine": machine_info(),
        "prompts": args.prompts,
        "entries": args.entries,
        "stages": stages,
        "threads": threads(args.runs, args.seconds) if args.seconds > 0 else [],
        "numpy": np.__version__,
    }
    save_report(args.out, "auto-itemize", report, markdown(report))
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    raise SystemExit(main())
