"""Dependencies failing under load: the gateway's Redis (its own redis-server on a free port,
never a shared one) hung with SIGSTOP, resumed, killed and restarted; and a storm of policy
reloads, most of them corrupted files, sent by file writes and SIGHUP. No request may fail."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from load_tests.bench_procs import free_port
from load_tests.mock_upstream import MockUpstream, new_event_loop
from load_tests.scenarios.served import ServedGateway, scenario_policy
from load_tests.scenarios.traffic import Outcomes, open_loop


class RedisProcess:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH")
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [*cmd, "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        import redis

        client = redis.Redis(port=self.port, socket_timeout=0.5)
        try:
            for _ in range(200):
                with contextlib.suppress(redis.RedisError, OSError):
                    if client.ping():
                        return
                time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError("redis-server did not start")

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _drive(gw: ServedGateway, rps: float, seconds: float, tag: str, temperature0: bool) -> Outcomes:
    def body(i: int) -> dict[str, Any]:
        b: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": f"{tag} {i % 40}"}]}
        if temperature0:
            b["temperature"] = 0
        if i % 2:
            b["stream"] = True
        return b

    loop = new_event_loop()
    try:
        return loop.run_until_complete(
            open_loop(gw.url + "/v1/chat/completions", gw.headers(), rps, seconds, body)
        )
    finally:
        loop.close()


def run_redis_outage(workdir: Path, *, rps: float = 30.0, seconds: float = 12.0) -> dict[str, Any]:
    """Timeline (fractions of ``seconds``): 0.25 SIGSTOP, 0.5 SIGCONT, 0.65 kill, 0.85 restart."""
    redis_proc = RedisProcess(workdir / "redis")
    redis_proc.start()
    events: list[str] = []
    try:
        with MockUpstream(ttft_ms=2, itl_ms=1, tokens=8) as mock:
            extra = f"cache: {{backend: redis, redis_url: '{redis_proc.url}', redis_timeout_s: 0.05}}"
            gw = ServedGateway(
                workdir / "gw", scenario_policy(mock.base_url, extra), args=["--log-level", "warning"]
            )
            with gw:
                gw.key()

                def chaos() -> None:
                    plan = [(0.25, "SIGSTOP"), (0.5, "SIGCONT"), (0.65, "kill"), (0.85, "restart")]
                    t0 = time.monotonic()
                    for at, what in plan:
                        time.sleep(max(0.0, t0 + at * seconds - time.monotonic()))
                        if what == "SIGSTOP":
                            redis_proc.signal(signal.SIGSTOP)
                        elif what == "SIGCONT":
                            redis_proc.signal(signal.SIGCONT)
                        elif what == "kill":
                            redis_proc.stop()
                        else:
                            redis_proc.start()
                        events.append(what)

                thread = threading.Thread(target=chaos, daemon=True)
                thread.start()
                out = _drive(gw, rps, seconds, "redis", temperature0=True)
                thread.join(seconds)
                rows = gw.wait_rows(out.total, timeout=20)
    finally:
        redis_proc.stop()
    return {
        "load": f"{rps:g} req/s for {seconds:g} s, half streaming, exact cache on Redis",
        "faults": "Redis hung (SIGSTOP), resumed, killed, restarted",
        **out.summary(),
        "faults_injected": len(events),
        "ledger_rows": len(rows),
        "rows_lost": max(0, out.total - len(rows)),
        "cache_hits": sum(1 for r in rows if r["cache_status"] == "hit"),
    }


def _broken_variants(good: str) -> list[bytes]:
    return [
        good[: len(good) // 2].encode(),
        b"",
        b"\xff\xfe\x00garbage",
        good.replace("routes:", "routes:\n  broken: {targets: [nope]}", 1).encode(),
        good.replace("providers:", "providers: [", 1).encode(),
        (good + "\nbogus_top_level: 1\n").encode(),
    ]


def run_reload_storm(workdir: Path, *, rps: float = 30.0, seconds: float = 8.0) -> dict[str, Any]:
    with MockUpstream(ttft_ms=2, itl_ms=1, tokens=8) as mock:
        good = scenario_policy(mock.base_url)
        gw = ServedGateway(
            workdir, good, args=["--log-level", "warning"], env={"SWITCHYARD_POLICY_WATCH_S": "0.05"}
        )
        with gw:
            gw.key()
            stop = threading.Event()
            writes = [0]

            def storm() -> None:
                variants = _broken_variants(good)
                i = 0
                while not stop.is_set():
                    data = variants[i % len(variants)] if i % 7 else good.encode()
                    gw.policy_path.write_bytes(data)  # in place: readers may see a torn file
                    if gw.proc is not None:
                        gw.proc.send_signal(signal.SIGHUP)
                    writes[0] += 1
                    i += 1
                    time.sleep(0.02)
                gw.policy_path.write_bytes(variants[0])  # end on a corrupted file

            thread = threading.Thread(target=storm, daemon=True)
            thread.start()
            out = _drive(gw, rps, seconds, "storm", temperature0=False)
            stop.set()
            thread.join(5)
            time.sleep(0.3)
            after = _drive(gw, 10, 1, "after-storm", temperature0=False)
            rows = gw.wait_rows(out.total + after.total, timeout=20)
            import urllib.request

            with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as resp:
                metrics = resp.read().decode()
    reloads = {
        label: int(float(line.rsplit(" ", 1)[1]))
        for line in metrics.splitlines()
        for label in ("ok", "error")
        if line.startswith(f'switchyard_policy_reloads_total{{result="{label}"}}')
    }
    summary = out.summary()
    summary["requests"] += after.total
    summary["ok"] += after.ok
    summary["bad"] += after.bad + after.clean_error + after.broken_stream_flagged
    return {
        "load": f"{rps:g} req/s for {seconds:g} s, half streaming",
        "faults": "policy rewritten every 20 ms (6 of 7 writes corrupted) + SIGHUP each time",
        **summary,
        "faults_injected": writes[0],
        "reloads": reloads,
        "ledger_rows": len(rows),
        "rows_lost": max(0, out.total + after.total - len(rows)),
    }
