"""The held-out check's shape on the evaluation data, end to end: a learned route over the
dcrouter stream's nine models (the mock upstream stands in for each, at its price), one system
prompt per task (no task header: the fingerprint names the task), a few hundred requests from
the three largest tasks, feedback for every served request from the stream's labels, and the
realised quality and cost read back from the ledger beside the best single model's."""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.lab.learned_streams import dcrouter
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import start_gateway

DATA = Path(os.environ.get("SHARED_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
PER_TASK = 100


def _policy(mock_url: str, prices: dict[str, float]) -> str:
    models = "\n".join(
        f"  {m}: {{provider: mock, upstream: mock-{i}, price: {{input: {p}, output: {p}}}}}"
        for i, (m, p) in enumerate(prices.items())
    )
    return f"""
providers:
  mock:
    type: openai
    base_url: {mock_url}/v1
    api_key: sk-upstream-canary-0123456789abcdef
models:
{models}
routes:
  learned:
    targets: [{", ".join(prices)}]
    retries: 0
    learn: {{quality_target: 0.95, task_floor: 0.85, seed: 1, sync_s: 2}}
"""


@pytest.mark.skipif(not (DATA / "routing-multi").is_dir(), reason="needs ../shared/data/routing-multi")
def test_learned_route_on_dcrouter_tasks_end_to_end(tmp_path: Path, mock: MockUpstream) -> None:
    rows = list(dcrouter(DATA / "routing-multi"))
    prices = {m: v["price"] for m, v in rows[0]["models"].items()}
    by_task: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows[1:]:
        by_task[str(r["task"])].append(r)
    tasks = sorted(by_task, key=lambda t: -len(by_task[t]))[:3]
    rng = random.Random(0)
    stream = [r for t in tasks for r in rng.sample(by_task[t], PER_TASK)]
    rng.shuffle(stream)
    gw = start_gateway(tmp_path, _policy(mock.base_url, prices))
    served: list[tuple[dict[str, object], str, str]] = []
    try:
        for r in stream:
            body = {
                "model": "learned",
                "messages": [
                    {"role": "system", "content": f"You answer {r['task']} questions."},
                    {"role": "user", "content": str(r["prompt"])[:2000]},
                ],
            }
            resp = gw.post("/v1/chat/completions", body)
            assert resp.status_code == 200
            model, rid = resp.headers["x-switchyard-model"], resp.headers["x-request-id"]
            served.append((r, model, rid))
            score = r["scores"][model]  # type: ignore[index]
            assert gw.post("/v1/feedback", {"request_id": rid, "score": score}).status_code == 200
        ledger = {row["request_id"]: row for row in gw.ledger_rows()}
    finally:
        gw.stop()
    quality = sum(r["scores"][m] for r, m, _ in served) / len(served)  # type: ignore[index]
    cost = sum(Decimal(ledger[rid]["cost_usd"]) for _, _, rid in served)
    single = {m: sum(r["scores"][m] for r in stream) / len(stream) for m in prices}  # type: ignore[index]
    best = max(single, key=lambda m: single[m])
    # the best single model's cost on the same tokens: each row's cost scaled by the price ratio
    best_cost = sum(
        Decimal(ledger[rid]["cost_usd"]) * Decimal(str(prices[best] / prices[m])) for _, m, rid in served
    )
    tasks_seen = {ledger[rid]["task"] for _, _, rid in served}
    decisions = {ledger[rid]["route_decision"].split(":")[0] for _, _, rid in served}
    figures = {
        "requests": len(served),
        "tasks": tasks,
        "best_single": best,
        "quality_vs_best": round(quality / single[best], 4),
        "cost_vs_best": round(float(cost / best_cost), 4),
        "explored": round(
            sum(ledger[rid]["route_decision"].startswith("explore") for _, _, rid in served) / len(served), 4
        ),
    }
    print(json.dumps(figures))
    assert len(tasks_seen) == 3 and all(t.startswith("sys:") for t in tasks_seen)
    assert decisions == {"explore", "exploit"}
    assert figures["cost_vs_best"] < 1.0 and figures["quality_vs_best"] > 0.85
