"""Load generator: open loop (fixed arrival rate) or closed loop (N clients), bounded in count and time.

Open loop: request i is scheduled at ``start + i / rps`` whether or not earlier ones
finished; latency is reported both from the scheduled time (includes any queueing in
the generator) and from the send time. Closed loop: N clients each send the next
request as soon as the previous one completes.

Streaming requests also report TTFT: time to the first body bytes that carry
generated content (a non-empty ``content``/``text``/``partial_json``).

CLI example::

    python -m load_tests.loadgen --url http://127.0.0.1:8001/v1/chat/completions \\
        --mode open --rps 300 --duration 5 [--stream] [--vary]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from load_tests.httpclient import CONTENT_RE, Connection, Response, Target, request_prefix

MAX_DURATION_S = 600.0
MAX_REQUESTS = 5_000_000
MAX_CONNECTIONS = 1024
# An idle keep-alive connection is reused only this soon after its last response: uvicorn closes
# idle connections after 5 s, and a request written as the server's FIN is in flight fails with
# ConnectionClosedError (the soak's rare "ConnectionClosedError: 1" under load on a fresh clone).
REUSE_IDLE_S = 2.0

BodyFactory = Callable[[int], bytes]


@dataclass(frozen=True)
class LoadSpec:
    """What to send and how much.

    ``body`` maps the request number to the request body (vary it to defeat caches).
    ``duration_s`` and ``max_requests`` both bound the run; ``timeout_s`` bounds each request.
    """

    url: str
    body: BodyFactory
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    duration_s: float = 5.0
    max_requests: int = 1_000_000
    timeout_s: float = 30.0
    drain_s: float = 10.0
    count_header: str | None = None


@dataclass
class _Sample:
    scheduled: float
    sent: float
    ttft: float | None
    done: float
    error: str | None


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/mean/max (linear interpolation) in milliseconds; None when empty."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    xs = sorted(values)

    def q(p: float) -> float:
        pos = (len(xs) - 1) * p
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return (xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)) * 1000.0

    return {
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "mean": sum(xs) / len(xs) * 1000.0,
        "max": xs[-1] * 1000.0,
    }


@dataclass
class Report:
    mode: str
    target_rps: float | None
    concurrency: int | None
    stream: bool
    count: int
    ok: int
    errors: dict[str, int]
    duration_s: float
    achieved_rps: float
    latency_ms: dict[str, float | None]
    latency_from_schedule_ms: dict[str, float | None]
    ttft_ms: dict[str, float | None]
    header_counts: dict[str, int]
    cancelled: int = 0
    connections: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Runner:
    """Holds one run's connections and samples."""

    def __init__(self, spec: LoadSpec) -> None:
        if not 0 < spec.duration_s <= MAX_DURATION_S:
            raise ValueError(f"duration_s must be in (0, {MAX_DURATION_S}]")
        if not 0 < spec.max_requests <= MAX_REQUESTS:
            raise ValueError(f"max_requests must be in (0, {MAX_REQUESTS}]")
        self.spec = spec
        self.target = Target.from_url(spec.url)
        self.samples: list[_Sample] = []
        self.header_counts: Counter[str] = Counter()
        self._idle: list[tuple[Connection, float]] = []  # (connection, idle since: monotonic)
        self.opened = 0
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        headers = {"accept": "text/event-stream" if spec.stream else "application/json", **spec.headers}
        self._prefix = request_prefix(self.target, headers)

    async def _connection(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn, idle_since = self._idle.pop()
            if conn.usable and now - idle_since < REUSE_IDLE_S:
                return conn
            conn.close()  # the server may be closing it right now (its keep-alive timeout)
        self.opened += 1
        return await Connection.open(self.target, content_re=CONTENT_RE if self.spec.stream else None)

    async def one(self, i: int, scheduled: float) -> None:
        """Send request ``i``; record a sample. Never raises (errors are samples)."""
        async with self._slots:
            sent = time.perf_counter()
            conn: Connection | None = None
            try:
                conn = await self._connection()
                body = self.spec.body(i)
                data = self._prefix + b"content-length: %d\r\n\r\n" % len(body) + body
                resp = await conn.request(data, self.spec.timeout_s)
            except Exception as exc:  # every failure is a sample, never an exception
                self.samples.append(_Sample(scheduled, sent, None, time.perf_counter(), type(exc).__name__))
                return
            self._record(resp, scheduled, sent)
            if conn.usable:
                self._idle.append((conn, time.monotonic()))

    def _record(self, resp: Response, scheduled: float, sent: float) -> None:
        error = None if resp.status == 200 else str(resp.status)
        if self.spec.count_header is not None:
            self.header_counts[resp.headers.get(self.spec.count_header, "-")] += 1
        ttft = None
        if self.spec.stream and error is None:
            if resp.first_content is None:
                error = "no_content"
            else:
                ttft = resp.first_content - sent
        self.samples.append(_Sample(scheduled, sent, ttft, resp.done, error))

    def close(self) -> None:
        for conn, _ in self._idle:
            conn.close()
        self._idle.clear()

    def report(self, mode: str, rps: float | None, concurrency: int | None, cancelled: int) -> Report:
        s = self.samples
        ok = [x for x in s if x.error is None]
        errors = Counter(x.error for x in s if x.error is not None)
        span = (max(x.done for x in s) - min(x.scheduled for x in s)) if s else 0.0
        return Report(
            mode=mode,
            target_rps=rps,
            concurrency=concurrency,
            stream=self.spec.stream,
            count=len(s),
            ok=len(ok),
            errors=dict(errors),
            duration_s=span,
            achieved_rps=(len(ok) / span) if span > 0 else 0.0,
            latency_ms=percentiles([x.done - x.sent for x in ok]),
            latency_from_schedule_ms=percentiles([x.done - x.scheduled for x in ok]),
            ttft_ms=percentiles([x.ttft for x in ok if x.ttft is not None]),
            header_counts=dict(self.header_counts),
            cancelled=cancelled,
            connections=self.opened,
        )


async def _drain(tasks: set[asyncio.Task[None]], seconds: float) -> int:
    """Wait for in-flight requests (bounded); cancel the rest. Returns how many were cancelled."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=seconds)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)


async def run_open_loop(spec: LoadSpec, rps: float) -> Report:
    """Start requests at ``rps`` per second for ``duration_s`` (at most ``max_requests``)."""
    if not 0 < rps <= 1_000_000:
        raise ValueError("rps must be in (0, 1e6]")
    runner = _Runner(spec)
    total = min(spec.max_requests, max(1, int(spec.duration_s * rps)))
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    start = time.perf_counter() + 0.01
    try:
        for i in range(total):
            due = start + i / rps
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif i % 16 == 0:
                await asyncio.sleep(0)  # behind schedule: still let requests run
            task = loop.create_task(runner.one(i, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        cancelled = await _drain(tasks, spec.drain_s + spec.timeout_s)
    finally:
        runner.close()
    return runner.report("open", rps, None, cancelled)


async def run_closed_loop(spec: LoadSpec, concurrency: int) -> Report:
    """``concurrency`` clients send back-to-back until ``duration_s`` or ``max_requests``."""
    if not 1 <= concurrency <= MAX_CONNECTIONS:
        raise ValueError(f"concurrency must be in [1, {MAX_CONNECTIONS}]")
    runner = _Runner(spec)
    counter = iter(range(spec.max_requests))
    deadline = time.perf_counter() + spec.duration_s

    async def client() -> None:
        for i in counter:
            now = time.perf_counter()
            if now >= deadline:
                return
            await runner.one(i, now)

    loop = asyncio.get_running_loop()
    tasks = {loop.create_task(client()) for _ in range(concurrency)}
    try:
        cancelled = await _drain(tasks, spec.duration_s + spec.timeout_s + spec.drain_s)
    finally:
        runner.close()
    return runner.report("closed", None, concurrency, cancelled)


# request bodies -------------------------------------------------------------
def chat_body(
    model: str,
    *,
    stream: bool = False,
    vary: bool = True,
    temperature: float | None = None,
    words: int = 8,
    tag: str = "",
) -> BodyFactory:
    """OpenAI chat request bodies; ``vary`` puts ``tag`` and the request number in the message."""
    filler = " ".join(["lorem"] * max(0, words - 3))

    def make(i: int) -> bytes:
        text = f"request {tag} {i if vary else 0} {filler}".strip()
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
        if stream:
            body["stream"] = True
        if temperature is not None:
            body["temperature"] = temperature
        return json.dumps(body).encode()

    if vary:
        return make
    fixed = make(0)
    return lambda _i: fixed


# CLI ------------------------------------------------------------------------
def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m load_tests.loadgen", description="HTTP load generator")
    p.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8001/v1/chat/completions")
    p.add_argument("--mode", choices=("open", "closed"), default="closed")
    p.add_argument("--rps", type=float, default=100.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--max-requests", type=int, default=1_000_000)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--model", default="mock-small")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--vary", action="store_true", help="different body per request (cache misses)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    p.add_argument("--count-header", default=None, help="count values of this response header")
    return p.parse_args(argv)


async def _cli(args: argparse.Namespace) -> Report:
    headers = dict(h.split(":", 1) for h in args.header)
    spec = LoadSpec(
        url=args.url,
        body=chat_body(args.model, stream=args.stream, vary=args.vary, temperature=args.temperature),
        headers={k.strip(): v.strip() for k, v in headers.items()},
        stream=args.stream,
        duration_s=args.duration,
        max_requests=args.max_requests,
        timeout_s=args.timeout,
        count_header=args.count_header,
    )
    if args.mode == "open":
        return await run_open_loop(spec, args.rps)
    return await run_closed_loop(spec, args.concurrency)


def main(argv: list[str] | None = None) -> int:
    from load_tests.mock_upstream import new_event_loop

    args = _parse(argv)
    loop = new_event_loop()
    try:
        report = loop.run_until_complete(_cli(args))
    finally:
        loop.close()
    print(json.dumps(report.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
