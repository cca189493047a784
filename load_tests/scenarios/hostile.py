"""A battery of hostile inputs against a live gateway (bodies, raw HTTP, traversal paths,
injected credentials): counts what was tried, every 5xx, every upstream call that an invalid
input caused, and whether the gateway still answers afterwards."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx2 as httpx

from load_tests.mock_upstream import MockUpstream
from load_tests.scenarios.served import ADMIN_KEY, ServedGateway, scenario_policy

MSG = [{"role": "user", "content": "x"}]
BAD_BODIES: list[bytes] = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"text"',
    b"{'model': 'auto'}",
    b'{"model": "auto", "messages": [',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b'{"model": "auto", "messages": [{"role": "user", "content": "caf\xe9 \xff"}]}',
    b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "auto", "temperature": 1e999, "messages": []}',
    b'{"model": 5, "messages": []}',
    b'{"model": "auto", "messages": "hi"}',
    b'{"model": "auto", "messages": [{"role": "robot", "content": "x"}]}',
    b'{"model": "auto", "messages": [{"role": "user", "content": 5}]}',
    b'{"model": "auto", "temperature": "hot", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "auto", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "auto", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "auto", "n": 0, "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "auto", "tools": "all", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "auto\\r\\nSet-Cookie: a=1", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "../../etc/passwd", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "' + b"m" * 100_000 + b'", "messages": [{"role": "user", "content": "x"}]}',
]
RAW_REQUESTS: list[bytes] = [
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 2\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    b"zz\r\n{}\r\n0\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-long: " + b"a" * 200_000 + b"\r\n\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\nhost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    b"BREW /v1/chat/completions HTCPCP/1.0\r\n\r\n",
]
TRAVERSAL = [
    "/dashboard/..%2f..%2f..%2fetc%2fpasswd",
    "/dashboard/%2e%2e/%2e%2e/etc/passwd",
    "/dashboard/../../../../etc/passwd",
    "/dashboard/%252e%252e%252fetc%252fpasswd",
    "/admin/keys/..%2f..%2fetc%2fpasswd",
    "/admin/%2e%2e/v1/models",
    "/static/../../../../etc/passwd",
]


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.settimeout(2)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
        return b"".join(chunks)


def run_hostile(workdir: Path) -> dict[str, Any]:
    with MockUpstream(ttft_ms=0, itl_ms=0, tokens=4) as mock:
        gw = ServedGateway(workdir, scenario_policy(mock.base_url), args=["--log-level", "warning"])
        with gw:
            headers = {**gw.headers(), "content-type": "application/json"}
            tried = five_xx = leaked = 0
            failures: list[str] = []
            with httpx.Client(timeout=30) as client:
                for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
                    for body in BAD_BODIES:
                        r = client.post(gw.url + path, content=body, headers=headers)
                        tried += 1
                        if r.status_code >= 500 or "Traceback" in r.text:
                            five_xx += 1
                            failures.append(f"{path} {body[:60]!r}: {r.status_code}")
                invalid_upstream_calls = len([q for q in mock.requests() if q["path"].startswith("/v1/")])
                for data in RAW_REQUESTS:
                    reply = _raw(gw.port, data)
                    tried += 1
                    if reply.startswith(b"HTTP/1.1 5"):
                        five_xx += 1
                        failures.append(f"raw {data[:40]!r}: {reply[:40]!r}")
                for path in TRAVERSAL:
                    for auth in (f"Bearer {ADMIN_KEY}", f"Bearer {gw.key()}"):
                        for method in ("GET", "DELETE", "POST"):
                            req = f"{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n"
                            reply = _raw(
                                gw.port, (req + "content-length: 0\r\nconnection: close\r\n\r\n").encode()
                            )
                            tried += 1
                            if b"root:" in reply:
                                leaked += 1
                                failures.append(f"traversal {method} {path} read a file")
                            if reply.startswith(b"HTTP/1.1 5"):
                                five_xx += 1
                                failures.append(f"traversal {method} {path}: {reply[:40]!r}")
                mock.clear_requests()
                hijack = {
                    "model": "auto",
                    "messages": MSG,
                    "api_base": "http://127.0.0.1:9/v1",
                    "api_key": "sk-x",
                }
                r = client.post(
                    gw.url + "/v1/chat/completions",
                    json=hijack,
                    headers={**gw.headers(), "x-api-key": "sk-x"},
                )
                tried += 1
                upstream = mock.requests()
                steered = r.status_code != 200 or len(upstream) != 1 or "sk-x" in repr(upstream[0]["headers"])
                alive = client.get(gw.url + "/healthz").status_code == 200
                ok = client.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": "auto", "messages": MSG},
                    headers=gw.headers(),
                )
    return {
        "load": "sequential",
        "bad_inputs": tried,
        "five_xx": five_xx,
        "upstream_calls_from_invalid_bodies": invalid_upstream_calls,
        "files_leaked": leaked,
        "client_steered_upstream": steered,
        "gateway_alive_after": alive and ok.status_code == 200,
        "failures": failures[:10],
        "rows_lost": 0,
    }
