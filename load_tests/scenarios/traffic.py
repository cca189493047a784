"""Open-loop traffic that keeps every response and classifies it: a clean success, a clean
OpenAI-shaped error, a stream flagged as broken (error event, no [DONE]), or a bad outcome (a
transport failure, a 500, a non-JSON error, a broken stream that still ends with [DONE])."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from load_tests.httpclient import Connection, Target, build_request

UPSTREAM_ERRORS = (429, 502, 503, 504)


@dataclass
class Outcomes:
    ok: int = 0
    clean_error: int = 0
    broken_stream_flagged: int = 0
    dirty_stream: int = 0  # an error event AND [DONE]: a broken stream dressed as success
    bad: int = 0
    keepalive_retries: int = 0  # requests resent after a pooled connection turned out closed
    statuses: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    bad_examples: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.ok + self.clean_error + self.broken_stream_flagged + self.dirty_stream + self.bad

    def p99_ms(self) -> float | None:
        if not self.latencies:
            return None
        xs = sorted(self.latencies)
        return round(xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, 1)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.total,
            "ok": self.ok,
            "clean_error": self.clean_error,
            "broken_stream_flagged": self.broken_stream_flagged,
            "dirty_stream": self.dirty_stream,
            "bad": self.bad,
            "keepalive_retries": self.keepalive_retries,
            "statuses": dict(sorted(self.statuses.items())),
            "p99_ms": self.p99_ms(),
            "bad_examples": self.bad_examples[:5],
        }


def _is_error_json(body: bytes) -> bool:
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and {"message", "type", "code"} <= set(err)


def classify(out: Outcomes, status: int, body: bytes, stream: bool) -> None:
    out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
    if status == 200 and stream:
        events = [ln[6:] for ln in body.decode("utf-8", "replace").splitlines() if ln.startswith("data: ")]
        done = bool(events) and events[-1] == "[DONE]"
        errored = any(e.startswith('{"error"') for e in events)
        if done and not errored:
            out.ok += 1
        elif errored and not done and "[DONE]" not in events:
            out.broken_stream_flagged += 1
        elif errored:
            out.dirty_stream += 1
        else:
            out.bad += 1
            out.bad_examples.append(f"stream without [DONE] or error event: {body[-200:]!r}")
        return
    if status == 200:
        out.ok += 1
    elif status in UPSTREAM_ERRORS and _is_error_json(body):
        out.clean_error += 1
    else:
        out.bad += 1
        out.bad_examples.append(f"{status}: {body[:200]!r}")


async def _one(
    target: Target, data: bytes, stream: bool, out: Outcomes, timeout: float, pool: list[Connection]
) -> None:
    t0 = time.perf_counter()
    conn = None
    while pool and conn is None:
        candidate = pool.pop()
        conn = candidate if candidate.usable else None
    reused = conn is not None
    try:
        try:
            if conn is None:
                conn = await Connection.open(target, keep_body=True)
            resp = await conn.request(data, timeout)
        except (RuntimeError, ConnectionError):
            # A pooled keep-alive connection the server closed while it sat idle (a race every
            # HTTP client has): the request was not taken, so it goes out on a fresh connection.
            if not reused:
                raise
            out.keepalive_retries += 1
            conn = await Connection.open(target, keep_body=True)
            resp = await conn.request(data, timeout)
    except Exception as exc:
        out.bad += 1
        out.bad_examples.append(f"transport: {type(exc).__name__}: {exc}")
        return
    out.latencies.append(time.perf_counter() - t0)
    classify(out, resp.status, resp.body, stream)
    if conn.usable:
        pool.append(conn)


async def open_loop(
    url: str,
    headers: dict[str, str],
    rps: float,
    seconds: float,
    body: Callable[[int], dict[str, Any]],
    *,
    timeout: float = 30.0,
    on_tick: Callable[[int], None] | None = None,
) -> Outcomes:
    """Send ``body(i)`` at ``rps`` for ``seconds`` (stream when the body says so)."""
    target = Target.from_url(url)
    out = Outcomes()
    pool: list[Connection] = []
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    total = max(1, int(rps * seconds))
    for i in range(total):
        delay = start + i / rps - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_tick is not None:
            on_tick(i)
        b = body(i)
        data = build_request(target, json.dumps(b).encode(), headers)
        task = asyncio.get_running_loop().create_task(
            _one(target, data, bool(b.get("stream")), out, timeout, pool)
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=timeout + 10)
    for conn in pool:
        conn.close()
    return out
