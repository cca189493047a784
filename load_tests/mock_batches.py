"""The mock upstream's Files + Batches API (OpenAI's shape), for the gateway's ``provider``
batch lane: ``POST /v1/files`` (multipart), ``GET /v1/files/{id}/content``, ``POST
/v1/batches``, ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

A batch answers each line as the mock answers the live endpoint; it shows ``in_progress`` on
its first retrieval and ``completed`` (output and error files) from the second, so a client
has to poll. A batch cancelled before that ends ``cancelled`` with no answers."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import orjson

from load_tests import mock_openai
from load_tests.mock_reply import Reply, openai_error


def _multipart(body: bytes, ctype: str) -> dict[str, bytes]:
    boundary = ctype.split("boundary=", 1)[-1].strip('"').encode()
    fields: dict[str, bytes] = {}
    for part in body.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if b'name="' not in head:
            continue
        name = head.split(b'name="', 1)[1].split(b'"', 1)[0].decode()
        fields[name] = value.removesuffix(b"\r\n")
    return fields


def _json(obj: Any) -> Reply:
    return Reply(body=orjson.dumps(obj))


class MockBatches:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes, query: str = "") -> Reply:
        with self._lock:
            parts = path.rstrip("/").split("/")[2:]  # after /v1
            if method == "POST" and parts == ["files"]:
                form = _multipart(body, headers.get("content-type", ""))
                if "file" not in form or form.get("purpose") != b"batch":
                    return openai_error(400, "file and purpose=batch are required")
                fid = f"file-mock{next(self._ids)}"
                self.files[fid] = form["file"]
                return _json(
                    {
                        "id": fid,
                        "object": "file",
                        "bytes": len(form["file"]),
                        "purpose": "batch",
                        "created_at": int(time.time()),
                        "filename": "batch.jsonl",
                    }
                )
            if method == "GET" and len(parts) == 3 and parts[0] == "files" and parts[2] == "content":
                data = self.files.get(parts[1])
                return (
                    Reply(body=data, content_type="application/octet-stream")
                    if data is not None
                    else (openai_error(404, "no such file", "not_found"))
                )
            if method == "POST" and parts == ["batches"]:
                req = orjson.loads(body)
                if req.get("input_file_id") not in self.files:
                    return openai_error(400, "unknown input_file_id")
                bid = f"batch_mock{next(self._ids)}"
                self.batches[bid] = {
                    "id": bid,
                    "object": "batch",
                    "endpoint": req["endpoint"],
                    "input_file_id": req["input_file_id"],
                    "status": "validating",
                    "output_file_id": None,
                    "error_file_id": None,
                    "created_at": int(time.time()),
                    "metadata": req.get("metadata"),
                    "polls": 0,
                }
                return _json(self._shown(bid))
            if method == "GET" and parts == ["batches"]:  # newest first, ?after=<id>&limit=<n>
                return _json(self._listing(query))
            if len(parts) >= 2 and parts[0] == "batches" and parts[1] in self.batches:
                batch = self.batches[parts[1]]
                if method == "POST" and parts[2:] == ["cancel"]:
                    if batch["status"] not in ("completed", "cancelled"):
                        batch["status"] = "cancelled"
                    return _json(self._shown(parts[1]))
                if method == "GET" and len(parts) == 2:
                    batch["polls"] += 1
                    if batch["status"] == "validating":
                        batch["status"] = "in_progress"
                    elif batch["status"] == "in_progress":
                        self._run(batch)
                    return _json(self._shown(parts[1]))
            return openai_error(404, f"no route for {method} {path}", "not_found")

    def _shown(self, bid: str) -> dict[str, Any]:
        return {k: v for k, v in self.batches[bid].items() if k != "polls"}

    def _listing(self, raw_query: str) -> dict[str, Any]:
        from urllib.parse import parse_qs

        query = parse_qs(raw_query)
        limit = int(query.get("limit", ["20"])[0])
        ids = list(reversed(self.batches))
        if "after" in query:
            after = query["after"][0]
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        page = [self._shown(b) for b in ids[:limit]]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        return {
            "object": "list",
            "data": page,
            "has_more": len(ids) > limit,
            "first_id": first,
            "last_id": last,
        }

    def _run(self, batch: dict[str, Any]) -> None:
        out, err = [], []
        now = int(time.time())
        for raw in self.files[batch["input_file_id"]].splitlines():
            if not raw.strip():
                continue
            line = orjson.loads(raw)
            rid = next(self._ids)
            if line["url"] == "/v1/embeddings":
                reply = mock_openai.embeddings(line["body"], rid)
            else:
                reply = mock_openai.chat_completion(line["body"], self.tokens, rid, now)
            result = {
                "id": f"batch_req_{rid}",
                "custom_id": line["custom_id"],
                "error": None,
                "response": {
                    "status_code": reply.status,
                    "request_id": f"req_{rid}",
                    "body": orjson.loads(reply.body),
                },
            }
            (out if reply.status == 200 else err).append(orjson.dumps(result))
        for key, lines in (("output_file_id", out), ("error_file_id", err)):
            if lines:
                fid = f"file-mock{next(self._ids)}"
                self.files[fid] = b"\n".join(lines) + b"\n"
                batch[key] = fid
        batch["status"] = "completed"


class MockMessageBatches:
    """Anthropic's Message Batches on the mock: ``POST /v1/messages/batches``, ``GET
    /v1/messages/batches/{id}`` (``in_progress`` at the first read, ``ended`` from the second),
    ``GET .../{id}/results``, ``POST .../{id}/cancel`` (before it ended: every request
    canceled)."""

    def __init__(self, tokens: int, seen: Any) -> None:
        self.tokens, self.seen = tokens, seen
        self.batches: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        from load_tests import mock_anthropic
        from load_tests.mock_reply import anthropic_error

        with self._lock:
            parts = path.rstrip("/").split("/")[4:]  # after /v1/messages/batches
            if method == "POST" and not parts:
                reqs = orjson.loads(body).get("requests")
                bid = f"msgbatch_mock{next(self._ids)}"
                self.batches[bid] = {
                    "id": bid,
                    "type": "message_batch",
                    "processing_status": "in_progress",
                    "cancel_initiated_at": None,
                    "requests": reqs,
                    "results": None,
                }
                return _json(self._shown(bid))
            if not parts or parts[0] not in self.batches:
                return anthropic_error(404, f"no route for {method} {path}")
            batch = self.batches[parts[0]]
            if method == "POST" and parts[1:] == ["cancel"]:
                if batch["results"] is None:
                    batch["cancel_initiated_at"] = "2026-01-01T00:00:00Z"
                    batch["results"] = [
                        {"custom_id": r["custom_id"], "result": {"type": "canceled"}}
                        for r in batch["requests"]
                    ]
                    batch["processing_status"] = "ended"
                return _json(self._shown(parts[0]))
            if method == "GET" and parts[1:] == ["results"]:
                lines = batch["results"] or []
                return Reply(
                    body=b"".join(orjson.dumps(x) + b"\n" for x in lines), content_type="application/binary"
                )
            if method == "GET" and not parts[1:]:
                if batch["processing_status"] == "in_progress" and batch.get("read"):
                    results = []
                    for i, r in enumerate(batch["requests"]):
                        reply = mock_anthropic.messages(
                            r["params"], headers, self.tokens, 10_000 + i, self.seen
                        )
                        result = (
                            {"type": "succeeded", "message": orjson.loads(reply.body)}
                            if reply.status == 200
                            else {"type": "errored", "error": orjson.loads(reply.body)}
                        )
                        results.append({"custom_id": r["custom_id"], "result": result})
                    batch["results"], batch["processing_status"] = results, "ended"
                batch["read"] = True
                return _json(self._shown(parts[0]))
            return anthropic_error(404, f"no route for {method} {path}")

    def _shown(self, bid: str) -> dict[str, Any]:
        b = self.batches[bid]
        return {k: b[k] for k in ("id", "type", "processing_status", "cancel_initiated_at")}
