"""One faiss index per semantic-cache partition (a tenant + route + conversation context).

Small partitions use an exact flat index with fp16 vectors (768 bytes an entry; a search
reads all of them: 0.56 ms at 16k, ``python -m load_tests.semcache_ivf``). When a partition reaches
``ivf_at`` entries (8,192 by default) it is upgraded to an IVF index, still fp16 (the
verifier is trained on exact cosines; 8-bit codes moved them by ~0.01), whose search cost
is ~ nprobe/nlist of the partition: the coarse
quantiser is trained in a background thread on a snapshot while the flat index keeps
serving; entries added meanwhile are carried over at the swap.

Removal is lazy: dead ids are skipped at search time and compacted out of the index in
bulk once they are a fifth of it. All methods are called from one thread (the event loop),
except the training job, which only reads its own snapshot."""

from __future__ import annotations

import importlib
import math
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import numpy.typing as npt

DIM = 384
Vectors = npt.NDArray[np.float32]


def faiss_module() -> Any:
    faiss: Any = importlib.import_module("faiss")
    faiss.omp_set_num_threads(1)
    return faiss


def _flat(faiss: Any) -> Any:
    inner = faiss.IndexScalarQuantizer(DIM, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    return faiss.IndexIDMap2(inner)


def _train_ivf(faiss: Any, ids: npt.NDArray[np.int64], vecs: Vectors, nlist: int) -> Any:
    """An IVF (fp16) index trained on and filled with the snapshot (runs in a worker thread)."""
    quantizer = faiss.IndexFlatIP(DIM)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, DIM, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    index.cp.niter = 10
    index.cp.max_points_per_centroid = 64
    index.set_direct_map_type(faiss.DirectMap.Hashtable)
    index.train(vecs)
    index.add_with_ids(vecs, ids)
    # Near-duplicates sit in the query's own cell or next to it. `python -m load_tests.semcache_ivf`
    # (16k QQP questions, 3,000 queries, 410 lists): nprobe 16 changes the top-1 of 0.1% of the
    # queries whose flat top-1 cosine is >= 0.8, at 0.07 ms a search against 0.56 ms flat.
    index.nprobe = max(16, nlist // 64)
    return index


class PartitionIndex:
    def __init__(self, ivf_at: int, executor: Executor) -> None:
        self._faiss = faiss_module()
        self._index = _flat(self._faiss)
        self.kind = "flat"
        self._ivf_at = ivf_at
        self._executor = executor
        self._dead: set[int] = set()
        self._upgrade: Future[Any] | None = None
        self._snapshot_rows = 0

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    @property
    def live(self) -> int:
        return self.ntotal - len(self._dead)

    def add(self, ids: npt.NDArray[np.int64], vecs: Vectors) -> None:
        self._finish_upgrade()
        self._index.add_with_ids(np.ascontiguousarray(vecs, dtype=np.float32), ids)
        if self._upgrade is None and self.kind == "flat" and self.live >= self._ivf_at:
            self._start_upgrade()

    def remove(self, eid: int) -> None:
        self._dead.add(eid)
        if len(self._dead) > max(256, self.ntotal // 5) and self._upgrade is None:
            self._compact()

    def search(self, vec: Vectors, k: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Top ``k`` live (score, id) pairs; ids of dead entries are filtered by the caller too."""
        self._finish_upgrade()
        if self.ntotal == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        dead = self._dead
        want = min(self.ntotal, k + min(len(dead), 32))
        scores, ids = self._index.search(vec.reshape(1, DIM), want)
        keep = ids[0] >= 0
        if dead:  # else nothing to filter (the usual case: no removal since the last compaction)
            keep &= np.array([int(i) not in dead for i in ids[0]], dtype=bool)
        return scores[0][keep][:k], ids[0][keep][:k]

    def vector(self, eid: int) -> Vectors:
        """The stored (fp16-rounded) vector of a live id."""
        self._finish_upgrade()
        vec: Vectors = self._index.reconstruct(int(eid))
        return vec

    # ------------------------------------------------------------- upgrade flat -> IVF
    def _snapshot(self) -> tuple[npt.NDArray[np.int64], Vectors]:
        faiss = self._faiss
        ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
        vecs = self._index.index.reconstruct_n(0, self._index.ntotal)
        alive = np.array([int(i) not in self._dead for i in ids], dtype=bool)
        return ids[alive], np.ascontiguousarray(vecs[alive], dtype=np.float32)

    def _start_upgrade(self) -> None:
        ids, vecs = self._snapshot()
        # 4 sqrt(n) lists, with at least 39 training points each (faiss' own minimum)
        nlist = max(16, min(4096, int(4 * math.sqrt(len(ids))), len(ids) // 39))
        self._snapshot_rows = int(self._index.ntotal)
        self._upgrade = self._executor.submit(_train_ivf, self._faiss, ids, vecs, nlist)

    def _finish_upgrade(self, wait: bool = False) -> None:
        fut = self._upgrade
        if fut is None or not (wait or fut.done()):
            return
        self._upgrade = None
        try:
            new = fut.result()
        except Exception:  # training failed: keep serving from the flat index
            self._ivf_at *= 2
            return
        start = self._snapshot_rows  # rows appended since the snapshot (no compaction meanwhile)
        count = self._index.ntotal - start
        if count > 0:
            ids = self._faiss.vector_to_array(self._index.id_map)[start:].astype(np.int64)
            vecs = self._index.index.reconstruct_n(start, count)
            for lo in range(0, count, 65536):
                new.add_with_ids(vecs[lo : lo + 65536], ids[lo : lo + 65536])
        self._index, self.kind = new, "ivf"
        self._compact()

    def wait_upgrade(self) -> None:
        """Block until a running upgrade is installed (tests and benchmarks)."""
        self._finish_upgrade(wait=True)

    def _compact(self) -> None:
        if self._dead:
            dead = np.fromiter(self._dead, dtype=np.int64, count=len(self._dead))
            self._index.remove_ids(dead)
            self._dead.clear()
