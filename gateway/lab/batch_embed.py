"""Embed many prompts for the offline tools (`switchyard train router`, `router score`,
`eval router`): several embedders on threads, and an optional on-disk cache of the vectors."""

from __future__ import annotations

import hashlib
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.cache.embedder import Embedder, load_embedder

CHUNK = 16  # texts per encode call: small, so the embedding threads share the work evenly


def load_embedders(n: int, backend: str) -> list[Embedder]:
    return [load_embedder(backend) for _ in range(n)]


def encode_all(texts: list[str], embedders: list[Embedder]) -> npt.NDArray[np.float32]:
    """Embed many texts on all the embedders at once (one thread each; ONNX Runtime releases the
    GIL): longest texts first, in small chunks taken from one shared queue so the threads finish
    together; rows returned in input order. Each text is still encoded alone (see embed_backends),
    so a score never depends on the other rows or on the thread count."""
    dim = embedders[0].dim
    out = np.zeros((len(texts), dim), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    chunks: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    for i in range(0, len(order), CHUNK):
        chunks.put(order[i : i + CHUNK])

    def work(emb: Embedder) -> None:
        while True:
            try:
                c = chunks.get_nowait()
            except queue.Empty:
                return
            out[c] = emb.encode([texts[i] for i in c])

    with ThreadPoolExecutor(len(embedders)) as pool:
        list(pool.map(work, embedders))
    return out


def cached_encode(
    texts: list[str], embedders: list[Embedder], cache_dir: Path | None
) -> npt.NDArray[np.float32]:
    if cache_dir is None:
        return encode_all(texts, embedders)
    digest = hashlib.sha256(("\x00".join(texts) + embedders[0].name).encode()).hexdigest()[:16]
    path = cache_dir / f"emb-{embedders[0].name}-{digest}.npy"
    if path.exists():
        cached: npt.NDArray[np.float32] = np.load(path)
        return cached
    vecs = encode_all(texts, embedders)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs
