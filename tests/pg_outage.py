"""A PostgreSQL that a test may take down and bring back.

Preferred: a private cluster (``initdb`` + ``pg_ctl`` from the PostgreSQL install, as the
``postgres`` user when we are root) on a free port, stopped with ``pg_ctl stop -m immediate``
(a crash: no shutdown checkpoint) and started again on the same data directory. Fallback when
no cluster can be made here: a TCP proxy in front of the shared server that cuts every
connection and refuses new ones while "down".
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from load_tests.bench_procs import free_port


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


class PrivateCluster:
    """``initdb`` a throw-away cluster; ``start()``/``crash()`` it; ``destroy()`` at the end."""

    kind = "private cluster (initdb/pg_ctl)"

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sy-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "pg.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o755)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str, timeout: float = 60) -> None:
        subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, timeout=timeout)

    def init(self) -> None:
        initdb = _pg_bin("initdb")
        if initdb is None:
            raise RuntimeError("initdb not found")
        self._run(initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl is not None
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")

    def crash(self) -> None:
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl is not None
        self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.crash()
        shutil.rmtree(self.dir, ignore_errors=True)


class CuttableProxy:
    """A TCP proxy to ``target``; ``crash()`` closes every connection and the listener,
    ``start()`` listens again on the same port."""

    kind = "TCP proxy in front of the shared PostgreSQL (cut and restored)"

    def __init__(self, target: tuple[str, int], database_url: str) -> None:
        self.target = target
        self.port = free_port()
        self._url = database_url
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._url.replace(f"{self.target[0]}:{self.target[1]}", f"127.0.0.1:{self.port}")

    def init(self) -> None:
        pass

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                cut = self._listener is not listener  # crash() ran while this one connected
                if not cut:
                    self._conns |= {client, upstream}
            if cut:
                client.close()
                upstream.close()
                return
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def crash(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            listener.close()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def destroy(self) -> None:
        self.crash()
