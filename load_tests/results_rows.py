"""The Markdown rows of load_tests/RESULTS.md, one renderer per reliability scenario
(``ROWS``: scenario name -> rows from its runs; medians, and the worst run for anything that
must be zero). ``load_tests.results`` runs the scenarios and writes the file."""

from __future__ import annotations

import statistics
from typing import Any


def med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _row_faults(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    failed = max(r["bad"] + r["dirty_stream"] for r in runs)
    return [
        "Upstream fault mix (12 kinds)",
        f"{r0['load']}; {_fmt(med([r['requests'] for r in runs]))} requests",
        f"{_fmt(med([r['faults_hit'] for r in runs]))} faults hit "
        f"({_fmt(med([r['broken_stream_flagged'] for r in runs]))} streams cut, flagged, no [DONE])",
        "-",
        str(failed),
        str(max(r["rows_lost"] for r in runs)),
        f"ok {_fmt(med([r['ok'] for r in runs]))}, "
        f"clean errors {_fmt(med([r['clean_error'] for r in runs]))}, "
        f"p99 {_fmt(med([r['p99_ms'] or 0 for r in runs]), 1)} ms",
    ]


def _row_redis(runs: list[dict[str, Any]]) -> list[str]:
    return [
        "Redis hung (SIGSTOP), killed, restarted",
        f"{runs[0]['load']}; {_fmt(med([r['requests'] for r in runs]))} requests",
        f"{runs[0]['faults_injected']} Redis events",
        "-",
        str(max(r["bad"] + r["clean_error"] for r in runs)),
        str(max(r["rows_lost"] for r in runs)),
        f"p99 {_fmt(med([r['p99_ms'] or 0 for r in runs]), 1)} ms, "
        f"cache hits {_fmt(med([r['cache_hits'] for r in runs]))} (recovered after restart)",
    ]


def _row_storm(runs: list[dict[str, Any]]) -> list[str]:
    return [
        "Policy reload storm, corrupted files",
        f"{runs[0]['load']}; {_fmt(med([r['requests'] for r in runs]))} requests",
        f"{_fmt(med([r['faults_injected'] for r in runs]))} writes + SIGHUPs, "
        f"{_fmt(med([r['reloads'].get('error', 0) for r in runs]))} rejected reloads, "
        f"{_fmt(med([r['reloads'].get('ok', 0) for r in runs]))} good",
        "-",
        str(max(r["bad"] + r["clean_error"] for r in runs)),
        str(max(r["rows_lost"] for r in runs)),
        f"p99 {_fmt(med([r['p99_ms'] or 0 for r in runs]), 1)} ms",
    ]


def _row_drain(runs: list[dict[str, Any]]) -> list[str]:
    w = [r["within"] for r in runs]
    p = [r["past"] for r in runs]
    failed = max(x["streams"] - x["completed_with_done"] for x in w) + max(
        x["completed_with_done"] for x in p
    )
    return [
        "SIGTERM with streams in flight",
        f"{w[0]['streams']} streams of {w[0]['stream_seconds']:g} s "
        f"(deadline {w[0]['graceful_timeout_s']:g} s); "
        f"{p[0]['streams']} of {p[0]['stream_seconds']:g} s (deadline {p[0]['graceful_timeout_s']:g} s)",
        f"SIGTERM; {_fmt(med([x['late_requests_refused'] for x in w]))} late requests refused",
        "-",
        str(failed),
        str(max(x["rows_lost"] for x in w + p)),
        f"drained with [DONE] and exited in {_fmt(med([x['exit_s'] for x in w]), 2)} s; past the deadline: "
        f"cut (no [DONE]) and exited in {_fmt(med([x['exit_s'] for x in p]), 2)} s",
    ]


def _row_overload(runs: list[dict[str, Any]]) -> list[str]:
    bursts = [b for r in runs for b in r["bursts"]]
    growth = [r["rss_after_bursts_kib"][-1] - r["rss_after_bursts_kib"][0] for r in runs]
    failed = max(sum(b["other"].values()) for b in bursts) + max(
        r["recovery"]["clients"] - r["recovery"]["ok"] for r in runs
    )
    return [
        f"Overload past max_in_flight={runs[0]['max_in_flight']}",
        f"bursts of {bursts[0]['clients']} concurrent requests, upstream {runs[0]['upstream_ms']:g} ms",
        f"{_fmt(med([b['shed_503'] for b in bursts]))} shed per burst (503 + Retry-After)",
        "-",
        str(failed),
        str(max(r["rows_lost"] for r in runs)),
        f"shed in {_fmt(med([b['shed_ms_p50'] or 0 for b in bursts]), 1)} ms (median), /healthz max "
        f"{_fmt(med([b['healthz_ms_max'] or 0 for b in bursts]), 1)} ms, "
        f"RSS +{_fmt(med(growth) / 1024, 1)} MiB "
        "after the first burst, recovered",
    ]


def _row_hostile(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    failed = max(
        r["five_xx"]
        + r["files_leaked"]
        + int(r["client_steered_upstream"])
        + int(not r["gateway_alive_after"])
        for r in runs
    )
    return [
        "Hostile input battery",
        "sequential",
        "-",
        str(r0["bad_inputs"]),
        str(failed),
        "0",
        f"5xx {max(r['five_xx'] for r in runs)}, upstream calls from invalid bodies "
        f"{max(r['upstream_calls_from_invalid_bodies'] for r in runs)}, files read by traversal "
        f"{max(r['files_leaked'] for r in runs)}",
    ]


def _row_client_leaves(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    failed = max(
        int(r["row"] != ["client_disconnected", 499]) + r["upstream_finished"] + int(not r["healthz_ok"])
        for r in runs
    )
    return [
        "Client leaves a fast stream",
        f"one stream of {r0['upstream_events']:,} chunks (20 MB) from the upstream; "
        "the client reads 64 KB and closes",
        "client gone mid-stream",
        "-",
        str(failed),
        str(max(int(r["row"][0] is None) for r in runs)),
        f"stopped (499 row) {_fmt(med([r['stop_ms'] for r in runs]), 1)} ms after the client left, "
        f"gateway CPU meanwhile {_fmt(med([r['cpu_s_after_leaving'] for r in runs]), 3)} s; "
        "the upstream wrote "
        f"{_fmt(med([r['upstream_written'] for r in runs]))} of {r0['upstream_events']:,} chunks",
    ]


def _row_budget_drift(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    drift = max((abs(float(r["drift_usd"])) for r in runs), default=0.0)
    return [
        "Budget drift after in-gateway faults",
        f"{r0['requests']} requests, sequential: good, unwritable answer (500), stream broken "
        "inside the gateway, client gone mid-stream",
        f"{3 * r0['requests'] // 4} failed inside the gateway or abandoned",
        "-",
        str(int(drift != 0)),
        str(max(r["rows_lost"] for r in runs)),
        f"budget spent - ledger cost = {drift:g} USD (worst run; must be 0); "
        f"ledger {r0['ledger_cost_usd']} USD",
    ]


def _row_prompt_sizes(runs: list[dict[str, Any]]) -> list[str]:
    sizes = [x["mb"] for x in runs[0]["sizes"]]
    worst = {
        mb: med([x["healthz_ms_max"] for r in runs for x in r["sizes"] if x["mb"] == mb]) for mb in sizes
    }
    failed = max(sum(1 for x in r["sizes"] if x["status"] != 200) for r in runs)
    return [
        "Huge prompts vs the event loop",
        "one prompt at a time, one unbroken word (the tokenizer's worst case), no upstream usage; "
        "/healthz polled every 5 ms",
        "-",
        str(len(sizes)),
        str(failed),
        "0",
        f"largest prompt with /healthz < 50 ms: {med([r['largest_mb_under_50ms'] for r in runs]):g} MB; "
        "slowest /healthz by size (0: a one-word prompt, the machine's baseline): "
        + ", ".join(f"{mb:g} MB {worst[mb]:.0f} ms" for mb in sizes),
    ]


def _row_slow_bodies(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    failed = max(
        r["clients"]
        - r["codes"].get("200", 0)
        + r["stalled"]
        - r["stalled_408"]
        + int(r["clients_done_s"] >= r["body_timeout_s"])  # served only once the stall was cut
        for r in runs
    )
    return [
        f"Slow bodies vs admission (max_in_flight={r0['max_in_flight']})",
        f"{r0['stalled']} authenticated connections send headers + 1 byte of body, then nothing; "
        f"{r0['clients']} normal requests meanwhile",
        f"{r0['stalled']} stalled bodies",
        "-",
        str(failed),
        "0",
        f"normal requests 200: {_fmt(med([r['codes'].get('200', 0) for r in runs]))}/{r0['clients']}, "
        f"p50 {_fmt(med([r['client_ms_p50'] for r in runs]), 1)} ms, all done "
        f"{_fmt(med([r['clients_done_s'] for r in runs]), 2)} s after the stall began; "
        "stalled cut with 408: "
        f"{_fmt(med([r['stalled_408'] for r in runs]))}/{r0['stalled']} after "
        f"{_fmt(med([r['stalled_cut_s'] for r in runs]), 2)} s (body_timeout_s {r0['body_timeout_s']:g})",
    ]


def _row_lying_usage(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    return [
        "Lying upstream usage",
        'completion_tokens -5, 10^19, null, "12", true, 1.5; JSON and SSE',
        "-",
        str(r0["cases"]),
        str(max(len(r["failed"]) for r in runs)),
        str(max(r["rows_lost"] for r in runs)),
        f"rows written, priced and marked estimated: "
        f"{_fmt(med([r['rows_estimated_and_priced'] for r in runs]))}/{r0['cases']}; "
        f"switchyard_usage_estimated_total {_fmt(med([r['metric_estimated_total'] for r in runs]))}",
    ]


def _row_deadline_cut(runs: list[dict[str, Any]]) -> list[str]:
    r0 = runs[0]
    failed = max(int(not r["ended_with_error_event"]) + int(r["row_status"] != "stream_broken") for r in runs)
    return [
        "deadline_s cuts a drip stream",
        f"a {r0['drip_s']:g} s drip stream (a chunk every 0.2 s) on a route with "
        f"deadline_s {r0['deadline_s']:g}",
        "-",
        "-",
        str(failed),
        str(max(r["rows_lost"] for r in runs)),
        f"cut after {_fmt(med([r['cut_after_s'] for r in runs]), 2)} s with an error event (no [DONE]); "
        "row stream_broken",
    ]


ROWS = {
    "faults": _row_faults,
    "redis": _row_redis,
    "reload_storm": _row_storm,
    "drain": _row_drain,
    "overload": _row_overload,
    "hostile": _row_hostile,
    "client_leaves": _row_client_leaves,
    "budget_drift": _row_budget_drift,
    "prompt_sizes": _row_prompt_sizes,
    "slow_bodies": _row_slow_bodies,
    "lying_usage": _row_lying_usage,
    "deadline_cut": _row_deadline_cut,
}


def soak_row(s: dict[str, Any], label: str) -> list[str]:
    load = s["load"]
    return [
        label,
        f"{s['rps']:g} req/s for {s['minutes']:g} min, half streaming, exact cache on; "
        f"{load['requests']:,} requests",
        "-",
        "-",
        str(sum(load["errors"].values())),
        str(s["rows_lost"]),
        f"RSS growth after warm-up {s['rss_growth'] * 100:.2f}% (limit 10%), fd growth {s['fd_growth']}",
    ]
