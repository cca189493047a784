"""OpenTelemetry traces with the GenAI semantic conventions, off unless configured.

One span per request (``gen_ai.operation.name`` + model, e.g. "chat small"), written when the
request is recorded, with the request's real start and end times. Attributes follow the
GenAI conventions (gen_ai.*) plus ``switchyard.*`` for cost, cache and route. The OTel SDK
is an optional extra (``pip install 'switchyard[otel]'``); nothing of it is imported while
tracing is off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.core.types import RequestFacts

log = logging.getLogger("switchyard")

OPERATION = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}


def span_attributes(f: RequestFacts) -> dict[str, Any]:
    """The span's attributes (None values left out, as OTel requires)."""
    op = OPERATION.get(f.endpoint, f.endpoint)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": op,
        "gen_ai.request.model": f.requested_model,
        "switchyard.request_id": f.request_id,
        "switchyard.route": f.route,
        "switchyard.tenant": f.tenant,
        "switchyard.cache": f.cache,
        "switchyard.status": f.status,
        "http.response.status_code": f.http_status,
    }
    if f.target is not None:
        attrs["gen_ai.response.model"] = f.target.upstream_model
        attrs["gen_ai.provider.name"] = f.provider_type or f.target.provider
        attrs["gen_ai.system"] = f.provider_type or f.target.provider
        attrs["switchyard.provider"] = f.target.provider
        attrs["switchyard.served_model"] = f.target.model
    if f.usage.input_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = f.usage.input_tokens
    if f.usage.output_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = f.usage.output_tokens
    if f.usage.cached_input_tokens is not None:
        attrs["switchyard.usage.cached_input_tokens"] = f.usage.cached_input_tokens
    attrs["switchyard.usage.estimated"] = f.usage.estimated
    if f.cost is not None:
        attrs["switchyard.cost_usd"] = str(f.cost)
    if f.baseline is not None:
        attrs["switchyard.baseline_cost_usd"] = str(f.baseline)
    if f.error_code is not None:
        attrs["error.type"] = f.error_code
    return attrs


class RequestTracer:
    """Writes one span per request through an OTel ``TracerProvider`` of its own."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.provider = provider
        self._tracer = provider.get_tracer("switchyard")
        self._kind = SpanKind.CLIENT
        self._error = Status(StatusCode.ERROR)

    def record(self, facts: RequestFacts) -> None:
        op = OPERATION.get(facts.endpoint, facts.endpoint)
        model = facts.target.model if facts.target is not None else facts.requested_model
        start_ns = int(facts.started_wall * 1e9)
        span = self._tracer.start_span(
            f"{op} {model}", kind=self._kind, start_time=start_ns, attributes=span_attributes(facts)
        )
        if facts.status not in ("ok",):
            span.set_status(self._error)
        span.end(end_time=max(start_ns, time.time_ns()))

    def shutdown(self) -> None:
        self.provider.shutdown()


def build_tracer(
    endpoint: str | None, service_name: str = "switchyard", exporter: Any = None
) -> RequestTracer | None:
    """A tracer exporting OTLP/HTTP to ``endpoint`` (or to ``exporter``, e.g. an in-memory one
    in tests); None when neither is given. Raises ImportError naming the extra when the OTel
    SDK is missing."""
    if endpoint is None and exporter is None:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("tracing needs the OpenTelemetry SDK: pip install 'switchyard[otel]'") from exc
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    log.info(
        "OpenTelemetry tracing on (%s)", "OTLP/HTTP " + endpoint if endpoint else type(exporter).__name__
    )
    return RequestTracer(provider)
