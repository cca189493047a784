"""An OpenAI-compatible provider's own batch API (core.ports_batch.BatchUpstream): upload the input
file (``purpose=batch``), create the batch, read its status, download its output and error
files, cancel it. A few calls per batch, not per request: plain aiohttp, one session a call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from gateway.core.errors import SwitchyardError
from gateway.providers import http

MAX_PAGES = 20  # of 100 batches: how far back ``find`` looks


class OpenAIBatchUpstream:
    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str | None,
        headers: Mapping[str, str] | None = None,
        responses: bool = False,
    ) -> None:
        self.name = name
        chat = {"/v1/chat/completions", "/v1/embeddings"}  # what it runs (Responses: when it speaks it)
        self.endpoints = frozenset(chat | {"/v1/responses"} if responses else chat)
        self._base = base_url.rstrip("/")
        self._headers = dict(headers or {})
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"

    async def _call(self, method: str, path: str, timeout: float, **kw: Any) -> bytes:
        try:
            async with (
                aiohttp.ClientSession(
                    headers=self._headers, timeout=aiohttp.ClientTimeout(total=timeout), trust_env=False
                ) as session,
                session.request(method, self._base + path, **kw) as resp,
            ):
                body = await resp.read()
                if resp.status != 200:
                    raise http.status_error(self.name, resp.status, dict(resp.headers), body)
                return body
        except SwitchyardError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise http.transport_error(self.name, exc) from None

    async def _json(self, method: str, path: str, timeout: float, **kw: Any) -> dict[str, Any]:
        raw = await self._call(method, path, timeout, **kw)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise http.bad_response(self.name, "body is not JSON") from None
        if not isinstance(data, dict):
            raise http.bad_response(self.name, "body is not a JSON object")
        return data

    async def submit(self, endpoint: str, lines: bytes, timeout: float, metadata: dict[str, str]) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", lines, filename="batch.jsonl", content_type="application/jsonl")
        uploaded = await self._json("POST", "/files", timeout, data=form)
        body = {
            "input_file_id": uploaded.get("id"),
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": metadata,
        }
        created = await self._json("POST", "/batches", timeout, json=body)
        if not isinstance(created.get("id"), str):
            raise http.bad_response(self.name, "the batch has no id")
        return str(created["id"])

    async def find(self, metadata: dict[str, str], since: float, timeout: float) -> str | None:
        """Pages through ``GET /batches`` (newest first) down to ``since``, less a minute."""
        after: str | None = None
        for _ in range(MAX_PAGES):
            query = "?limit=100" + (f"&after={after}" if after else "")
            page = await self._json("GET", "/batches" + query, timeout)
            listed = page.get("data")
            data: list[dict[str, Any]] = (
                [b for b in listed if isinstance(b, dict)] if isinstance(listed, list) else []
            )
            for b in data:
                shown = b.get("metadata")
                tags: dict[str, Any] = shown if isinstance(shown, dict) else {}
                if all(tags.get(k) == v for k, v in metadata.items()) and isinstance(b.get("id"), str):
                    return str(b["id"])
            older = [b for b in data if float(b.get("created_at") or 0) < since - 60]
            if not data or older or not page.get("has_more"):
                return None
            after = str(data[-1].get("id"))
        return None

    async def status(self, batch_id: str, timeout: float) -> dict[str, Any]:
        return await self._json("GET", f"/batches/{batch_id}", timeout)

    async def content(self, file_id: str, timeout: float) -> bytes:
        return await self._call("GET", f"/files/{file_id}/content", timeout)

    async def cancel(self, batch_id: str, timeout: float) -> None:
        await self._json("POST", f"/batches/{batch_id}/cancel", timeout)
