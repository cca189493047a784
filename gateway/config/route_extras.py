"""A route's optional lanes in the policy: the Batch API's lane and the batches' limits,
prompt compression, a learned route, a verifier cascade, shadow evaluation (the rest of the
schema: config/policy.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.strict import Strict as _Strict


class RouteBatchPolicy(_Strict):
    """How the route runs Batch API items (docs/batch.md). ``low_priority``: as ordinary
    requests, at most ``concurrency`` at a time, paused while ``yield_above`` interactive
    requests or more are in flight; ``self_hosted``: also only while every self-hosted engine
    of the route has spare capacity (waiting queue <= ``max_waiting``, KV cache use <=
    ``max_kv_usage``, as its /metrics probe reads them); ``provider``: the whole batch is sent
    to the first target's provider's own batch API (OpenAI-compatible providers) and each item
    priced at the model's ``price.batch`` share of its price."""

    lane: Literal["low_priority", "self_hosted", "provider"] = "low_priority"
    concurrency: int = Field(default=4, ge=0, le=1024)  # 0: paused (no item starts; a reload resumes)
    yield_above: int | None = Field(default=8, gt=0)
    max_waiting: int = Field(default=0, ge=0)
    max_kv_usage: float = Field(default=0.8, gt=0, le=1)
    # An item whose upstream call was cut by a crash or a shutdown: ``resend`` it under the same
    # Idempotency-Key (an upstream that honours the key runs it once), or ``fail`` it (error
    # ``batch_item_interrupted``) where the upstream would run and bill it twice.
    on_interrupted: Literal["resend", "fail"] = "resend"


class CompressionPolicy(_Strict):
    """Prompt compression on the route (docs/compression.md). ``lossless``: JSON minified,
    trailing spaces and extra blank lines cut, repeated blocks marked, in user text and tool
    outputs; the cached prefix does not move. ``trim_tool_outputs_after``: tool outputs older
    than that many tool-carrying turns cut to a stub (lossy; it moves the cached prefix)."""

    lossless: bool = False
    trim_tool_outputs_after: int | None = Field(default=None, ge=0)


class BatchesPolicy(_Strict):
    """The Files and Batch APIs (docs/batch.md)."""

    max_file_bytes: int = Field(default=200 * 1024 * 1024, gt=0)  # an uploaded file, at most
    max_items: int = Field(default=50_000, gt=0)  # lines (requests) of one batch, at most
    lease_s: float = Field(default=900.0, gt=0)  # a claimed item is taken back after this (a dead worker)
    poll_interval_s: float = Field(default=0.5, gt=0, le=60)  # while a batch is open
    idle_poll_s: float = Field(default=4.0, gt=0, le=300)  # with none open: backs off up to this
    upstream_poll_s: float = Field(
        default=30.0, gt=0, le=3600
    )  # lane provider: the provider's batch read this often


class LearnPolicy(_Strict):
    """A learned route (gateway/routing/learned.py): per (tenant, task), the target that holds
    the route's quality at ``quality_target`` x the best single target's and every task at
    ``task_floor`` x its best, at the least cost, learnt from the feedback on what it served."""

    quality_target: float = Field(default=0.95, gt=0, le=1)
    task_floor: float = Field(default=0.85, ge=0, le=1)
    explore_share: float = Field(default=0.02, ge=0, le=0.4)  # of a task's requests
    prior_strength: float = Field(default=12.0, gt=0)  # most pseudo-observations the prior is worth
    sync_s: float = Field(default=10.0, gt=0)  # how often a replica re-reads the shared evidence
    seed: int | None = None  # fixed draws (tests, simulations); None: random


class CascadePolicy(_Strict):
    """A verifier cascade: the first target answers; when a check fails the next targets are
    tried (gateway/routing/verify.py: json, schema, tool_calls, math, refusal; ``check``: a
    plug-in ``module:function`` taking (completion, request) and returning a reason or None).
    Streams are not cascaded (served by the route as usual; the header says so).
    ``escalate_share`` / ``escalate_above`` grade the ``math`` check (routing/verify_score.py):
    escalate the top share of recent answers by suspicion score, or those scoring above.
    ``second_sample``: an answer that passes is sampled again from the first target and
    escalates when the two final answers differ (self-consistency; needs sampling, not
    temperature 0)."""

    verify: list[Literal["json", "schema", "tool_calls", "math", "refusal"]] = Field(default_factory=list)
    check: str | None = Field(default=None, pattern=r"^[\w.]+:[\w]+$")
    escalate_share: float | None = Field(default=None, gt=0, lt=1)
    escalate_above: float | None = Field(default=None, gt=0, lt=1)
    second_sample: bool = False

    @model_validator(mode="after")
    def _something(self) -> CascadePolicy:
        if not self.verify and self.check is None:
            raise ValueError("'cascade' needs 'verify' checks or a 'check' plug-in")
        graded = self.escalate_share is not None or self.escalate_above is not None
        if self.escalate_share is not None and self.escalate_above is not None:
            raise ValueError("'cascade' takes 'escalate_share' or 'escalate_above', not both")
        if graded and "math" not in self.verify:
            raise ValueError(
                "'escalate_share' and 'escalate_above' grade the 'math' check: add it to 'verify'"
            )
        if self.second_sample and "math" not in self.verify:
            raise ValueError("'second_sample' compares final answers: add 'math' to 'verify'")
        return self


class ShadowPolicy(_Strict):
    """Shadow evaluation: a sampled ``share`` of the route's answered requests is also sent to
    ``candidate`` (in the background, after the answer), and the served answer is judged by
    the ``verify`` checks or by the ``judge`` model against the candidate's answer; the score
    becomes the request's feedback. Shadow calls stop while their spend exceeds
    ``max_spend_share`` of what the route spent; every shadow call is a ledger row."""

    share: float = Field(default=0.05, gt=0, le=1)
    max_spend_share: float = Field(default=0.1, gt=0, le=1)
    candidate: str
    judge: str | None = None
    verify: list[Literal["json", "schema", "tool_calls", "math", "refusal"]] = Field(default_factory=list)
    seed: int | None = None

    @model_validator(mode="after")
    def _judged(self) -> ShadowPolicy:
        if self.judge is None and not self.verify:
            raise ValueError("'shadow' needs a 'judge' model or 'verify' checks")
        return self
