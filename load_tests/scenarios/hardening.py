"""Hostile clients and lying upstreams (issue 14) against a real ``switchyard serve`` process:
a client that leaves a fast stream, budget drift after failures inside the gateway, the largest
prompt that keeps /healthz fast, slow-body clients against admission, impossible upstream
usage, and ``deadline_s`` cutting a drip stream. Each ``run_*`` returns its figures; the
upstream is ``load_tests.lying_upstream.LyingUpstream`` (the one tests/test_hardening.py uses)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx

from load_tests.lying_upstream import (
    CHAT,
    Json,
    LyingUpstream,
    answer_of,
    chat_body,
    chunk,
    healthz_while,
    lying_policy,
    nested,
    stalled_bodies,
)
from load_tests.scenarios.served import ADMIN_KEY, ServedGateway

HELLO = [{"role": "user", "content": "hello there"}]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sse_events(text: str) -> list[str]:
    return [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]


def _served(work: Path, liar: LyingUpstream, extra: str = "", budget: str = "1") -> ServedGateway:
    policy = lying_policy(liar.base_url, extra).replace("daily_usd: 1}", f"daily_usd: {budget}}}")
    return ServedGateway(work, policy).start()


def _post(gw: ServedGateway, body: Any, tenant: str = "capped", timeout: float = 60) -> httpx.Response:
    with httpx.Client(timeout=timeout) as c:
        return c.post(gw.url + CHAT, json=body, headers=gw.headers(tenant))


def spent_usd(gw: ServedGateway, tenant: str = "capped") -> Decimal:
    r = httpx.get(gw.url + "/admin/budgets", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    r.raise_for_status()
    for row in r.json()["budgets"]:
        if row["scope"] == "tenant" and row["name"] == tenant and row["period"] == "day":
            return Decimal(row["spent_usd"])
    return Decimal(0)


# ----------------------------------------------------------------------------- class 1
def run_client_leaves(work: Path, chunks: int = 200_000, batch: int = 500) -> dict[str, Any]:
    """A client reads 64 KB of a fast 20 MB stream and closes: how long until the gateway has
    stopped (its 499 row), the CPU it spent meanwhile, and how much the upstream still wrote."""
    with LyingUpstream() as liar:
        piece = "x" * 100
        liar.events, liar.batch = (lambda: (chunk(piece) for _ in range(chunks))), batch
        gw = _served(work, liar)
        try:
            body = {"model": "lie", "messages": HELLO, "max_tokens": 8, "stream": True}
            read, cpu0, left = 0, cpu_s(gw.pid), time.monotonic()
            with (
                httpx.Client(timeout=30) as client,
                client.stream("POST", gw.url + CHAT, json=body, headers=gw.headers("capped")) as r,
            ):
                for part in r.iter_bytes():
                    read += len(part)
                    if read > 64 * 1024:
                        cpu0, left = cpu_s(gw.pid), time.monotonic()
                        break
            rows = gw.wait_rows(1, timeout=20)
            stopped = time.monotonic() - left
            time.sleep(0.5)  # anything still running would keep burning CPU here
            cpu = cpu_s(gw.pid) - cpu0
            t0 = time.perf_counter()
            healthz_ok = httpx.get(gw.url + "/healthz", timeout=10).status_code == 200
            row = rows[0] if rows else {}
            return {
                "upstream_events": chunks,
                "upstream_written": liar.written,
                "upstream_finished": liar.finished,
                "stop_ms": round(stopped * 1000, 1),
                "cpu_s_after_leaving": round(cpu, 3),
                "row": [row.get("status"), row.get("http_status")],
                "healthz_ms_after": round((time.perf_counter() - t0) * 1000, 1),
                "healthz_ok": healthz_ok,
            }
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- class 2
def run_budget_drift(work: Path, each: int = 10) -> dict[str, Any]:
    """Requests that fail inside the gateway (an answer that cannot be written back, a stream
    broken by one, a client that leaves) next to good ones: what the budget says was spent
    minus what the ledger rows cost must be 0, with no reservation left behind."""
    with LyingUpstream() as liar:
        gw = _served(work, liar)
        codes: dict[str, int] = {}
        try:
            good = chat_body(usage={"prompt_tokens": 3, "completion_tokens": 5})
            broken = chat_body(usage={"prompt_tokens": 3, "completion_tokens": 1}, extra=nested(300))

            def bad_stream() -> Iterator[Json]:
                yield chunk("hi")
                bad = chunk(" there")
                bad["x"] = nested(300)
                yield bad

            def long_stream() -> Iterator[Json]:
                for _ in range(2000):
                    yield chunk("x" * 50)

            for kind in ("good", "unwritable", "broken_stream", "client_left"):
                for _ in range(each):
                    liar.json = broken if kind == "unwritable" else good
                    liar.events = bad_stream if kind == "broken_stream" else long_stream
                    stream = kind in ("broken_stream", "client_left")
                    body = {"model": "lie", "messages": HELLO, "max_tokens": 8, "stream": stream}
                    if kind == "client_left":
                        with (
                            httpx.Client(timeout=30) as c,
                            c.stream("POST", gw.url + CHAT, json=body, headers=gw.headers("capped")) as r,
                        ):
                            next(r.iter_bytes())
                        status = 499
                    else:
                        status = _post(gw, body).status_code
                    codes[f"{kind} {status}"] = codes.get(f"{kind} {status}", 0) + 1
            rows = gw.wait_rows(4 * each, timeout=20)
            time.sleep(0.5)
            rows = gw.ledger_rows()
            cost = sum((Decimal(str(x["cost_usd"] or 0)) for x in rows), Decimal(0))
            spent = spent_usd(gw)
            return {
                "requests": 4 * each,
                "codes": codes,
                "rows": len(rows),
                "rows_lost": 4 * each - len(rows),
                "ledger_cost_usd": str(cost),
                "budget_spent_usd": str(spent),
                "drift_usd": str(spent - cost),
            }
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- class 6
def run_prompt_sizes(work: Path, sizes_mb: tuple[float, ...] = (0, 0.25, 0.5, 1, 2, 4, 8)) -> dict[str, Any]:
    """Prompts of one unbroken word (the tokenizer's worst case), answered without usage so the
    gateway counts them itself, while /healthz is polled: the slowest /healthz per size, and
    the largest size that kept it under 50 ms. Size 0 (a one-word prompt) is the baseline: what
    /healthz costs on this machine with nothing heavy in flight."""
    with LyingUpstream() as liar:
        liar.json = chat_body("ok", usage=None)
        gw = _served(work, liar, "server: {max_body_bytes: 33554432}\n", budget="1000")
        try:
            _post(gw, {"model": "lie", "messages": HELLO, "max_tokens": 8})  # warm: encodings loaded
            out: list[dict[str, Any]] = []
            for mb in sizes_mb:
                big = "x" * int(mb * 1024 * 1024) or "hi"
                body = {"model": "lie", "messages": [{"role": "user", "content": big}], "max_tokens": 8}
                probes: list[float] = []
                t0 = time.perf_counter()
                worst, status = healthz_while(gw.port, lambda b=body: _post(gw, b).status_code, probes)  # type: ignore[misc]
                out.append(
                    {
                        "mb": mb,
                        "status": status,
                        "request_ms": round((time.perf_counter() - t0) * 1000, 1),
                        "healthz_ms_max": round(worst * 1000, 1),
                        "healthz_ms_p50": round(statistics.median(probes) * 1000, 2) if probes else None,
                        "probes": len(probes),
                    }
                )
            fast = [x["mb"] for x in out if x["mb"] and x["healthz_ms_max"] < 50 and x["status"] == 200]
            return {"sizes": out, "largest_mb_under_50ms": max(fast) if fast else 0}
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- class 7
def run_slow_bodies(
    work: Path, stalled: int = 32, max_in_flight: int = 8, timeout_s: float = 10.0, clients: int = 10
) -> dict[str, Any]:
    """``stalled`` authenticated connections send headers and one byte of their body, then
    nothing; meanwhile ``clients`` normal requests (sequential, each a fresh connection): how
    many are served and how fast (``clients_done_s`` < ``body_timeout_s``: all of them while
    every stalled body was still held), and whether every stalled one gets its 408."""
    with LyingUpstream() as liar:
        extra = f"server: {{max_in_flight: {max_in_flight}, body_timeout_s: {timeout_s:g}}}\n"
        gw = _served(work, liar, extra)
        try:
            body = {"model": "lie", "messages": HELLO}
            _post(gw, body)  # warm
            socks = stalled_bodies(gw.port, gw.key("capped"), stalled)
            opened = time.monotonic()
            try:
                time.sleep(0.3)
                codes: dict[str, int] = {}
                ms: list[float] = []
                for _ in range(clients):
                    t0 = time.perf_counter()
                    status = _post(gw, body, timeout=30).status_code
                    ms.append((time.perf_counter() - t0) * 1000)
                    codes[str(status)] = codes.get(str(status), 0) + 1
                served_within = time.monotonic() - opened
                answers = [answer_of(s) for s in socks]
                cut_after = time.monotonic() - opened
            finally:
                for s in socks:
                    s.close()
            return {
                "stalled": stalled,
                "max_in_flight": max_in_flight,
                "body_timeout_s": timeout_s,
                "clients": clients,
                "codes": codes,
                "client_ms_p50": round(statistics.median(ms), 1),
                "client_ms_max": round(max(ms), 1),
                "clients_done_s": round(served_within, 2),
                "stalled_408": sum(1 for a in answers if a.startswith(b"HTTP/1.1 408")),
                "stalled_cut_s": round(cut_after, 2),
            }
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- class 5
LIES: tuple[Any, ...] = (-5, 10**19, None, "12", True, 1.5)


def run_lying_usage(work: Path) -> dict[str, Any]:
    """Upstream usage that cannot be true (negative, 10^19, null, a string, a boolean, a float),
    in JSON answers and in streams: every request must succeed and leave a priced row marked
    as estimated."""
    with LyingUpstream() as liar:
        gw = _served(work, liar)
        try:
            bad: list[str] = []
            for stream in (False, True):
                for lie in LIES:
                    usage = {"prompt_tokens": 3, "completion_tokens": lie, "total_tokens": 4}
                    liar.json = chat_body("hello back", usage=usage)
                    liar.events = lambda u=usage: iter([chunk("hello"), chunk(" back"), chunk(None, u)])  # type: ignore[misc]
                    r = _post(gw, {"model": "lie", "messages": HELLO, "stream": stream})
                    ok = r.status_code == 200 and (not stream or sse_events(r.text)[-1] == "[DONE]")
                    if not ok:
                        bad.append(f"{lie!r}/{'sse' if stream else 'json'}: {r.status_code}")
            cases = 2 * len(LIES)
            rows = gw.wait_rows(cases, timeout=20)
            estimated = sum(1 for x in rows if x["usage_estimated"] and x["cost_usd"] is not None)
            metrics = httpx.get(gw.url + "/metrics", timeout=30).text
            counted = sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in metrics.splitlines()
                if ln.startswith("switchyard_usage_estimated_total{")
            )
            return {
                "cases": cases,
                "failed": bad,
                "rows": len(rows),
                "rows_lost": cases - len(rows),
                "rows_estimated_and_priced": estimated,
                "metric_estimated_total": counted,
            }
        finally:
            gw.stop()


# ----------------------------------------------------------------------------- class 11
def run_deadline_cut(work: Path, deadline_s: float = 1.5, drip_s: float = 8.0) -> dict[str, Any]:
    """A stream that drips one chunk every 0.2 s for ``drip_s`` on a route with ``deadline_s``:
    when it is cut, how it ends, and its row."""
    with LyingUpstream() as liar:
        liar.delay_s = 0.2
        n = int(drip_s / liar.delay_s)

        def events() -> Iterator[Json]:
            for _ in range(n):
                yield chunk("x")
            yield chunk(None, {"prompt_tokens": 3, "completion_tokens": n})

        liar.events = events
        gw = ServedGateway(
            work,
            lying_policy(liar.base_url).replace(
                "retries: 0\n", f"retries: 0\n    deadline_s: {deadline_s:g}\n", 1
            ),
        ).start()
        try:
            t0 = time.monotonic()
            r = _post(gw, {"model": "lie", "messages": HELLO, "stream": True})
            took = time.monotonic() - t0
            events_out = sse_events(r.text)
            rows = gw.wait_rows(1, timeout=20)
            last = events_out[-1] if events_out else ""
            return {
                "deadline_s": deadline_s,
                "drip_s": drip_s,
                "cut_after_s": round(took, 2),
                "ended_with_error_event": last != "[DONE]" and "deadline" in last,
                "row_status": rows[0]["status"] if rows else None,
                "rows_lost": 1 - len(rows[:1]),
            }
        finally:
            gw.stop()
