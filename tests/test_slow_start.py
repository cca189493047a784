"""A start-up slower than ``app.START_GRACE_S`` goes on in the background: the process listens,
/healthz answers, /readyz and the API say 503 "starting" until it is done, and a start-up that
fails late is reported (/healthz 503; under ``switchyard serve`` the process exits 3) instead of hanging. The slow part here is real: another
connection holds the SQLite ledger's write lock, as a second worker migrating it would."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from gateway.api.app import START_GRACE_S
from gateway.api.starting import STARTUP_FAILURE
from gateway.ledger.store import SQLiteLedger
from load_tests.mock_upstream import MockUpstream
from tests.gateway_harness import RunningGateway, free_port, mock_policy, start_gateway

REPO = Path(__file__).resolve().parent.parent

CHAT = {"model": "small", "messages": [{"role": "user", "content": "hello"}]}


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _locked(path: Path) -> sqlite3.Connection:
    """A connection holding ``path``'s write lock (WAL mode, as the ledger keeps it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_a_locked_ledger_start_listens_answers_503_then_serves(tmp_path: Path, mock: MockUpstream) -> None:
    db = tmp_path / "home" / "ledger.db"
    ready = SQLiteLedger(db)
    ready.start()
    ready.close()
    holder = _locked(db)
    started = time.monotonic()
    gw: RunningGateway | None = None
    try:
        gw = start_gateway(tmp_path, mock_policy(mock.base_url))
        assert time.monotonic() - started < START_GRACE_S + 10
        live = gw.get("/healthz")
        assert live.status_code == 200
        assert live.json()["status"] == "starting"
        ready_ = gw.get("/readyz")
        assert ready_.status_code == 503
        waiting = "starting the ledger: waiting for another process's migration or back-fill (the database is locked)"
        assert ready_.json() in (
            {"status": "starting", "phase": "starting the ledger: migrating the schema"},
            {"status": "starting", "phase": waiting},  # past SQLite's 5 s busy timeout already
        )
        assert gw.get("/metrics").status_code == 503
        refused = gw.post("/v1/chat/completions", CHAT)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        error = refused.json()["error"]
        assert error["code"] == "starting" and error["type"] == "server_error"
        assert "migrating the schema" in error["message"]
        messages = gw.post(
            "/v1/messages", {"model": "small", "max_tokens": 8, "messages": [CHAT["messages"][0]]}
        )
        assert messages.status_code == 503 and messages.headers["retry-after"] == "5"
        assert messages.json()["type"] == "error"
        assert messages.json()["error"]["type"] == "overloaded_error"
        assert not mock.requests()  # refused before any handler: nothing sent, nothing to lose
        _wait(lambda: gw.get("/readyz").json()["phase"] == waiting)  # the lock wait is named
    finally:
        holder.rollback()
        holder.close()
    assert gw is not None
    try:
        _wait(lambda: gw.get("/readyz").status_code == 200)
        assert gw.get("/healthz").json() == {"status": "ok"}
        answer = gw.post("/v1/chat/completions", CHAT)
        assert answer.status_code == 200, answer.text
        assert [r["requested_model"] for r in gw.ledger_rows()] == ["small"]
        assert gw.get("/metrics").status_code == 200
    finally:
        gw.stop()


def test_a_start_up_that_fails_late_says_so_and_fails_liveness(tmp_path: Path, mock: MockUpstream) -> None:
    """The lock holder leaves a ``schema_migrations`` table the migration cannot read: the
    ledger's start fails after the grace period, for real."""
    db = tmp_path / "home" / "ledger.db"
    db.parent.mkdir(parents=True)
    holder = _locked(db)
    holder.execute("CREATE TABLE schema_migrations (x INTEGER)")
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        assert gw.get("/healthz").status_code == 200
        holder.commit()
        _wait(lambda: gw.get("/healthz").status_code == 503)
        assert gw.get("/healthz").json() == {"status": "failed", "phase": "failed"}
        assert gw.get("/readyz").status_code == 503
        refused = gw.post("/v1/chat/completions", CHAT)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "start_failed"
        assert "retry-after" not in refused.headers
        assert "schema_migrations" not in refused.text  # details go to the log, not to clients
        assert not mock.requests()
    finally:
        holder.close()
        gw.stop()


@pytest.mark.parametrize("hold", [False, True])
def test_a_shutdown_during_or_after_start_up_is_clean(tmp_path: Path, mock: MockUpstream, hold: bool) -> None:
    db = tmp_path / "home" / "ledger.db"
    db.parent.mkdir(parents=True)
    holder = _locked(db) if hold else None
    gw = start_gateway(tmp_path, mock_policy(mock.base_url))
    try:
        assert gw.get("/healthz").status_code == 200
    finally:
        gw.stop()
        assert not gw.thread.is_alive()  # the lifespan ended without waiting for the lock
        if holder is not None:
            holder.close()


SERVE = (sys.executable, "-m", "gateway.cli", "serve")


@pytest.mark.parametrize("workers", [1, 2])
def test_switchyard_serve_exits_3_when_its_start_up_fails_late(
    tmp_path: Path, mock: MockUpstream, workers: int
) -> None:
    """Under ``switchyard serve`` (``SWITCHYARD_EXIT_ON_START_FAILURE`` on by default) a late
    failure ends the process with uvicorn's start-up failure code, as an early one does; with
    two workers the supervisor stops the other one and exits 3 too (not 0)."""
    home = tmp_path / "home"
    home.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(mock_policy(mock.base_url))
    holder = _locked(home / "ledger.db")
    holder.execute("CREATE TABLE schema_migrations (x INTEGER)")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(SWITCHYARD_HOME=str(home), SWITCHYARD_POLICY=str(policy), PYTHONUNBUFFERED="1")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*SERVE, "--port", str(port), "--log-level", "info", "--workers", str(workers)],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def starting() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        _wait(starting)  # listening, past the grace, still waiting for the lock
        holder.commit()  # the migration now meets a schema_migrations table it cannot read
        assert proc.wait(timeout=30) == STARTUP_FAILURE
        text = log.read_text()
        assert "start-up failed; exiting (code 3)" in text and "schema_migrations" in text
        assert not mock.requests()
    finally:
        holder.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
