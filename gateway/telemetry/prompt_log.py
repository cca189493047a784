"""Prompt and completion logging, off unless the policy opts in (``server.log_prompts``).

By default no log line carries a prompt or a completion: they are the users' data. With the
opt-in, one INFO line per answered chat request goes to the ``switchyard.prompts`` logger
(request id, tenant, messages, the answer's choices), through the same redacting filter as
every other log line, so provider and client keys are still scrubbed."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway.config.policy import Policy

log = logging.getLogger("switchyard.prompts")

MAX_LOGGED_BYTES = 64 * 1024  # one log line stays bounded whatever the prompt size


def log_exchange(policy: Policy, request_id: str, tenant: str, body: Any, completion: Any) -> None:
    if not policy.server.log_prompts:
        return
    messages = body.get("messages") if isinstance(body, dict) else None
    choices = completion.get("choices") if isinstance(completion, dict) else None
    record = orjson.dumps({"messages": messages, "choices": choices}, default=str)
    text = record[:MAX_LOGGED_BYTES].decode("utf-8", "replace")
    log.info("prompt log %s tenant=%s %s", request_id, tenant, text)
