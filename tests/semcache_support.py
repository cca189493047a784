"""Shared pieces of the semantic-cache / embedder tests: one loaded embedder per session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

QQP = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "semcache" / "qqp-dev.jsonl"


@pytest.fixture(scope="session")
def embedder(shared_model_dir: Path) -> Iterator[Any]:
    """The production embedder (auto backend), its ONNX export in the session's model folder."""
    from gateway.cache.embedder import load_embedder

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWITCHYARD_MODEL_DIR", str(shared_model_dir))
        emb = load_embedder("auto")
    yield emb
    emb.close()


def qqp_rows(limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` QQP pairs; none when ../shared/data is not there (callers that need
    them skip, the others use their own sentences only)."""
    if not QQP.exists():
        return []
    rows = []
    with QQP.open() as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) >= limit:
                break
    return rows
