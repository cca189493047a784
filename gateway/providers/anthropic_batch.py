"""Anthropic's Message Batches API as a core.ports_batch.BatchUpstream: the gateway's batch lines
(OpenAI's input format, each body an Anthropic Messages request) go up as one Message Batch;
its results come back as OpenAI-style output lines (``response.body``: the message, or the
error), so flow/batch_forward.py reads every provider's answers one way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.providers import http
from gateway.providers.openai_batch import OpenAIBatchUpstream

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicBatchUpstream(OpenAIBatchUpstream):
    def __init__(
        self, name: str, base_url: str, api_key: str | None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(
            name, base_url, None, {"anthropic-version": ANTHROPIC_VERSION, **dict(headers or {})}
        )
        if api_key:
            self._headers["x-api-key"] = api_key
        self.endpoints = frozenset({"/v1/messages"})

    async def find(self, metadata: dict[str, str], since: float, timeout: float) -> str | None:
        """A Message Batch takes no metadata (its create body is only ``requests``): one whose
        id was never noted cannot be told from the account's other batches."""
        raise NotImplementedError("Anthropic's Message Batches keep no metadata")

    async def submit(self, endpoint: str, lines: bytes, timeout: float, metadata: dict[str, str]) -> str:
        requests = []
        for raw in lines.splitlines():
            if raw.strip():
                line = orjson.loads(raw)
                requests.append({"custom_id": line["custom_id"], "params": line["body"]})
        created = await self._json("POST", "/v1/messages/batches", timeout, json={"requests": requests})
        if not isinstance(created.get("id"), str):
            raise http.bad_response(self.name, "the message batch has no id")
        return str(created["id"])

    async def status(self, batch_id: str, timeout: float) -> dict[str, Any]:
        """In OpenAI's terms: ``completed`` (or ``cancelled``) once it ended, its results the
        output file (named by the batch id)."""
        info = await self._json("GET", f"/v1/messages/batches/{batch_id}", timeout)
        if info.get("processing_status") != "ended":
            return {"status": "in_progress"}
        status = "cancelled" if info.get("cancel_initiated_at") else "completed"
        return {"status": status, "output_file_id": batch_id, "error_file_id": None}

    async def content(self, file_id: str, timeout: float) -> bytes:
        raw = await self._call("GET", f"/v1/messages/batches/{file_id}/results", timeout)
        out = []
        for text in raw.splitlines():
            if not text.strip():
                continue
            line = orjson.loads(text)
            result = line.get("result") or {}
            if result.get("type") == "succeeded":
                response = {"status_code": 200, "body": result.get("message")}
            elif result.get("type") == "errored":
                response = {"status_code": 400, "body": result.get("error")}
            else:  # canceled, expired: not run (flow/batch_forward.py ends the item so)
                continue
            out.append(
                orjson.dumps({"custom_id": line.get("custom_id"), "response": response, "error": None})
            )
        return b"\n".join(out)

    async def cancel(self, batch_id: str, timeout: float) -> None:
        await self._json("POST", f"/v1/messages/batches/{batch_id}/cancel", timeout)
