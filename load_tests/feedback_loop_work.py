"""The event-loop work of ``POST /v1/feedback``'s flow (validation, hand-off to the feedback
store's worker thread, the learned route's update), as the loop thread's CPU time per call,
over a real SQLite ledger. Usage: python load_tests/feedback_loop_work.py [N]"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from gateway.flow import learning
from gateway.ledger.feedback import FeedbackStore
from gateway.ledger.sqlite import connect, migrate
from gateway.routing.learned_routes import LearnedRoutes


def main(n: int = 1000) -> None:
    path = Path(tempfile.mkdtemp()) / "ledger.db"
    conn = connect(path)
    migrate(conn)
    conn.execute(
        "INSERT INTO ledger (request_id, ts, tenant, route, requested_model, served_model, endpoint, stream, "
        "cache_status, usage_estimated, latency_ms, status, http_status, attempts, task) "
        "VALUES ('r1', 1, 'acme', 'learned', 'learned', 'small', 'chat', 0, 'miss', 0, 1, 'ok', 200, 1, 't')"
    )
    conn.close()
    store = FeedbackStore(f"sqlite:///{path}")
    svc = SimpleNamespace(feedback=store, learned=LearnedRoutes())

    async def run() -> tuple[list[float], list[float]]:
        cpu, wall = [], []
        for _ in range(n):
            t0, w0 = time.thread_time(), time.perf_counter()
            await learning.post(svc, "acme", {"request_id": "r1", "score": 1})  # type: ignore[arg-type]
            cpu.append(time.thread_time() - t0)
            wall.append(time.perf_counter() - w0)
        return cpu, wall

    try:
        cpu, wall = asyncio.run(run())
    finally:
        store.close()
    p99 = sorted(cpu)[int(0.99 * len(cpu))]
    print(
        f"{n} feedbacks: loop CPU p50 {statistics.median(cpu) * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us; "
        f"wall p50 {statistics.median(wall) * 1e6:.0f} us (the write runs on the store's thread)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
