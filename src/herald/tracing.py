"""Traces, with the optional extra ``herald[otel]``: a span per attempt and per relay batch,
exported over OTLP/HTTP to ``tracing.otlp_endpoint``.

Without an endpoint, or without the extra installed, nothing of OpenTelemetry is
imported and every call here is one boolean test. Spans are recorded after the fact,
with the start and end times the engine measured anyway: no context manager wraps the
work. The one exception is an attempt for an event that came with the producer's
``traceparent``: its span is started before the request, because the request carries
the span's own id (:func:`start`).
"""

from __future__ import annotations

import time
from typing import Any

_tracer: Any = None
_provider: Any = None

ATTEMPT_SPAN = "herald.attempt"
RELAY_SPAN = "herald.relay.batch"


class TracingUnavailable(RuntimeError):
    """An endpoint is configured but the ``otel`` extra is not installed."""


def enabled() -> bool:
    return _tracer is not None


def configure(*, endpoint: str, service_name: str = "herald") -> bool:
    """Export spans to ``endpoint`` (an OTLP/HTTP base URL, e.g. ``http://collector:4318``).
    An empty endpoint leaves tracing off and imports nothing; True when on."""
    global _tracer, _provider
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing.otlp_endpoint is set but OpenTelemetry is not installed:"
            " pip install 'herald[otel]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    _provider = provider
    _tracer = provider.get_tracer("herald")
    return True


def start(name: str, *, started: float, traceparent: str | None) -> tuple[Any, str | None]:
    """A span begun at ``started`` (epoch seconds), the child of the producer's context
    ``traceparent`` (a valid W3C one, see herald.ingest) when there is one; and the
    ``traceparent`` to send on with the work the span stands for: this span's own
    (W3C: the receiver's parent is Herald's span), None when the producer sent none.
    Tracing off: no span, and the producer's header passes through unchanged."""
    tracer = _tracer
    if tracer is None:
        return None, traceparent
    from opentelemetry import trace

    context = None
    if traceparent is not None:
        _, trace_id, parent_id, flags = traceparent.split("-")
        parent = trace.SpanContext(
            int(trace_id, 16),
            int(parent_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(int(flags, 16)),
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    span = tracer.start_span(name, context=context, start_time=int(started * 1e9))
    if traceparent is None:
        return span, None
    own = span.get_span_context()
    return span, f"00-{own.trace_id:032x}-{own.span_id:016x}-{int(own.trace_flags):02x}"


def finish(span: Any, *, ended: float, attributes: dict[str, Any]) -> None:
    """End a span from :func:`start` at ``ended`` (epoch seconds). Attributes whose value
    is None are left out (OTLP has no null); an outcome other than success marks it failed."""
    if span is None:
        return
    attrs = {k: v for k, v in attributes.items() if v is not None}
    span.set_attributes(attrs)
    if attrs.get("herald.outcome") not in (None, "success"):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, str(attrs.get("herald.error", ""))[:200]))
    span.end(end_time=int(ended * 1e9))


def record(name: str, *, started: float, ended: float, attributes: dict[str, Any]) -> None:
    """One finished span of no producer's trace (see :func:`finish`)."""
    if _tracer is None:
        return
    span, _ = start(name, started=started, traceparent=None)
    finish(span, ended=ended, attributes=attributes)


def shutdown(timeout: float = 5.0) -> None:
    """Export what is buffered and stop (at the end of the process)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        deadline = time.monotonic() + timeout
        provider.force_flush(timeout_millis=int(timeout * 1000))
        if time.monotonic() < deadline:
            provider.shutdown()
