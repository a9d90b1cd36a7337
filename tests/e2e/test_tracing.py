"""Traces (the ``otel`` extra): with ``tracing.otlp_endpoint`` set, the daemon exports a
span per attempt and per relay batch over OTLP/HTTP, here to a local receiver that
decodes what it gets; without an endpoint nothing of OpenTelemetry is imported."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import pytest
from aiohttp import web

from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.e2e.test_traceparent import TRACEPARENT, insert_traced
from tests.support.receiver import Receiver, verification_ok_then

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the otel extra is not installed (make dev installs it)",
)


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "resource": resource,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "start": span.start_time_unix_nano / 1e9,
                            "end": span.end_time_unix_nano / 1e9,
                            "error": span.status.code == 2,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                        }
                    )
        return web.Response(status=200)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


async def test_a_span_per_attempt_and_per_relay_batch(herald_factory: HeraldFactory) -> None:
    collector = await Collector().start()
    receiver = await Receiver(
        secrets=[SECRET],
        behaviour=verification_ok_then(
            lambda r: web.Response(status=204 if r.event_id != "evt_tr00002" else 503)
        ),
    ).start()
    try:
        h = herald_factory(
            {
                "tracing": {
                    "otlp_endpoint": f"http://127.0.0.1:{collector.port}",
                    "service_name": "herald-e2e",
                },
                "delivery": {"max_retries": 0},
            },
            start=False,
        )
        await h.astart()
        dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["trace.*"])
        await wait_active(h, dest["id"])
        h.insert_events(rows(3, prefix="evt_tr", type_="trace.x"))
        await wait_deliveries(h, "kind = 'event' AND status <> 'pending'", 3)
        # evt_tr00002's delivery ran out (max_retries 0): Herald's own event about it
        # goes through the relay too, as a fourth event.
        deadline = time.monotonic() + 15
        exhausted = "SELECT COUNT(*) FROM herald_events WHERE type = 'herald.delivery.exhausted'"
        while h.query(exhausted)[0][0] < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 15
        while len(collector.named("herald.attempt")) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await h.astop() == 0  # flushes what is buffered
    finally:
        await receiver.stop()
        await collector.stop()
    attempts = {s["attributes"]["herald.event.id"]: s for s in collector.named("herald.attempt")}
    assert set(attempts) >= {"evt_tr00000", "evt_tr00001", "evt_tr00002"}
    ok, failed = attempts["evt_tr00000"], attempts["evt_tr00002"]
    assert ok["resource"]["service.name"] == "herald-e2e"
    assert (
        ok["attributes"]
        | {
            "herald.destination.type": "webhook",
            "herald.destination.id": dest["id"],
            "herald.outcome": "success",
            "http.response.status_code": 204,
            "herald.attempt": 1,
            "herald.delivery.kind": "event",
        }
        == ok["attributes"]
    )
    assert not ok["error"]
    assert ok["start"] <= ok["end"]
    assert failed["attributes"]["herald.outcome"] == "failure_retryable"
    assert failed["attributes"]["http.response.status_code"] == 503
    assert failed["error"]
    # The verification ping is an attempt too.
    assert any(
        s["attributes"]["herald.delivery.kind"] == "verification"
        for s in collector.named("herald.attempt")
    )
    batches = collector.named("herald.relay.batch")
    assert sum(s["attributes"]["herald.relay.events"] for s in batches) == 3 + 1
    assert sum(s["attributes"]["herald.relay.deliveries"] for s in batches) == 3


def test_without_an_endpoint_nothing_is_imported() -> None:
    """The daemon's modules and an empty endpoint leave OpenTelemetry unimported."""
    code = (
        "import sys, herald.app, herald.cli.daemon, herald.attempt, herald.outbox\n"
        "from herald import tracing\n"
        "assert tracing.configure(endpoint='') is False\n"
        "assert not tracing.enabled()\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("processes", [1, 2])
async def test_the_attempt_span_continues_the_producers_trace(
    herald_factory: HeraldFactory, processes: int
) -> None:
    """The attempt span is the child of the producer's ``traceparent``, and the receiver's
    header names that span (W3C: its parent is Herald's attempt), in the daemon and in
    its attempt processes alike; an event without one goes without the header."""
    collector = await Collector().start()
    receiver = await Receiver(secrets=[SECRET]).start()
    try:
        h = herald_factory(
            {
                "tracing": {"otlp_endpoint": f"http://127.0.0.1:{collector.port}"},
                "delivery": {"worker_processes": processes},
            },
            start=False,
        )
        await h.astart()
        dest = await h.acreate_webhook(receiver.url, secret=SECRET, events=["trace.*"])
        await wait_active(h, dest["id"])
        insert_traced(
            h,
            [
                ("evt_tc1", "trace.x", TRACEPARENT),
                ("evt_tc2", "trace.x", None),
            ],
        )
        await receiver.wait_for(lambda: len(receiver.counts("trace.x")) == 2, what="events")

        def spans() -> dict[str, dict[str, Any]]:
            return {
                s["attributes"]["herald.event.id"]: s
                for s in collector.named("herald.attempt")
                if s["attributes"]["herald.event.id"].startswith("evt_tc")
            }

        await receiver.wait_for(lambda: len(spans()) == 2, what="attempt spans")
        assert await h.astop() == 0
    finally:
        await receiver.stop()
        await collector.stop()
    assert receiver.errors == []
    got = {r.event_id: r for r in receiver.events("trace.x")}
    assert all(r.verified for r in got.values())
    traced, plain = spans()["evt_tc1"], spans()["evt_tc2"]
    _, trace_id, parent_id, _ = TRACEPARENT.split("-")
    assert (traced["trace_id"], traced["parent_span_id"]) == (trace_id, parent_id)
    assert traced["span_id"] != parent_id
    assert got["evt_tc1"].headers["traceparent"] == f"00-{trace_id}-{traced['span_id']}-01"
    # No producer context: a trace of Herald's own, and nothing sent on.
    assert plain["parent_span_id"] == ""
    assert plain["trace_id"] != trace_id
    assert "traceparent" not in got["evt_tc2"].headers
