"""herald.tracing without a collector: off by default, a clear error without the extra."""

from __future__ import annotations

import sys

import pytest

from herald import tracing


def test_an_empty_endpoint_leaves_tracing_off() -> None:
    assert tracing.configure(endpoint="") is False
    assert not tracing.enabled()
    tracing.record(tracing.ATTEMPT_SPAN, started=1.0, ended=2.0, attributes={})  # a no-op
    tracing.shutdown()


def test_an_endpoint_without_the_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail, as when the package is absent.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(tracing.TracingUnavailable, match=r"herald\[otel\]"):
        tracing.configure(endpoint="http://127.0.0.1:4318")
    assert not tracing.enabled()


def test_tracing_off_passes_the_producers_traceparent_through() -> None:
    """Without a tracer the attempt sends the producer's header unchanged, and no span."""
    value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert not tracing.enabled()
    assert tracing.start(tracing.ATTEMPT_SPAN, started=1.0, traceparent=value) == (None, value)
    assert tracing.start(tracing.ATTEMPT_SPAN, started=1.0, traceparent=None) == (None, None)
    tracing.finish(None, ended=2.0, attributes={"herald.outcome": "success"})  # a no-op
