"""Helpers for the ledger durability tests: a ``switchyard serve`` subprocess and a threaded
load generator that remembers the request id of every response a client fully received."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx

from load_tests.bench_procs import GatewayProcess

ADMIN_KEY = "sy-admin-durability-0123456789"


@contextlib.contextmanager
def gateway_process(
    home: Path, mock_port: int, env: dict[str, str] | None = None
) -> Iterator[tuple[GatewayProcess, str]]:
    """``switchyard serve`` (one worker) on the bench policy (route ``bench``); yields it and a
    client key. Stopped with SIGTERM at the end unless the test killed it."""
    home.mkdir(parents=True, exist_ok=True)
    gw, key = GatewayProcess.start(home, mock_port, ADMIN_KEY, None, timeout=90, extra_env=env)
    try:
        yield gw, key
    finally:
        gw.stop()


@dataclass
class Load:
    """``threads`` clients sending chat requests (every third one streamed, every fifth one a
    repeat that the exact cache answers) until ``stop()``."""

    url: str
    key: str
    threads: int = 8
    completed: list[str] = field(default_factory=list)  # x-request-id of complete responses
    failed: list[str] = field(default_factory=list)  # what went wrong, for the assertion message
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Load:
        for t in range(self.threads):
            worker = threading.Thread(target=self._run, args=(t,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout)

    def count(self) -> int:
        with self._lock:
            return len(self.completed)

    def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"only {self.count()} of {n} requests completed; failures: {self.failed[:5]}"
                )
            time.sleep(0.01)

    def _run(self, t: int) -> None:
        headers = {"authorization": f"Bearer {self.key}"}
        i = 0
        with httpx.Client(timeout=10, headers=headers) as client:
            while not self._stop.is_set():
                i += 1
                stream = i % 3 == 0
                text = "repeat me" if i % 5 == 0 else f"thread {t} request {i}"
                body = {"model": "bench", "messages": [{"role": "user", "content": text}], "stream": stream}
                if i % 5 == 0:
                    body["temperature"] = 0  # cacheable: the exact cache answers repeats
                try:
                    rid = self._one(client, body, stream)
                except (httpx.HTTPError, ValueError) as exc:
                    rid = None
                    with self._lock:
                        self.failed.append(f"{type(exc).__name__}: {exc}")
                if rid is not None:
                    with self._lock:
                        self.completed.append(rid)

    def _one(self, client: httpx.Client, body: dict[str, object], stream: bool) -> str | None:
        url = self.url + "/v1/chat/completions"
        if not stream:
            r = client.post(url, json=body)
            if r.status_code != 200:
                raise ValueError(f"status {r.status_code}: {r.text[:200]}")
            json.loads(r.content)  # the whole body arrived
            return r.headers["x-request-id"]
        with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                raise ValueError(f"status {r.status_code}")
            last = ""
            for line in r.iter_lines():
                if line:
                    last = line
            if last != "data: [DONE]":
                raise ValueError(f"stream ended with {last!r}")
            return r.headers["x-request-id"]
