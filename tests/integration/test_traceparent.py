"""A producer's ``traceparent`` (W3C Trace Context) from the outbox to the receiver, on
both backends: stored with the event, read back by every event query, sent as a
header on the first attempt and on a retry, dropped (never the event) when invalid."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from aiohttp import web

from herald.model import DeliveryStatus
from herald.outbox import publish
from tests.integration.conftest import (
    Harness,
    HarnessFactory,
    ReceiverFactory,
    running,
)
from tests.integration.test_dispatch import only_delivery, wait_for_delivery
from tests.integration.test_handover import handing_over
from tests.support.receiver import Received

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INVALID = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"  # upper case


def seq_of(h: Harness, event_id: str) -> int:
    return int(h.scalar("SELECT seq FROM herald_outbox WHERE id = ?", (event_id,)))


async def test_the_column_round_trips_through_every_event_query(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/hook")
    traced = h.produce("order.created", {"n": 1}, traceparent=TRACEPARENT)
    bad = h.produce("order.created", {"n": 2}, traceparent=INVALID)
    plain = h.produce("order.created", {"n": 3})
    empty = h.produce("order.created", {"n": 4}, traceparent="")  # none given: no warning
    bad_seq = seq_of(h, bad)
    waiting = await h.store.get_outbox_event("default", traced)  # before the relay
    assert waiting is not None
    assert waiting.traceparent == TRACEPARENT
    with structlog.testing.capture_logs() as logs:
        assert await h.relay.run_once() == 4
    # The invalid one costs the event nothing but its trace context, and is named.
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox_rejected") == 0
    [warning] = [e for e in logs if e["event"] == "traceparent_ignored"]
    assert (warning["seq"], warning["event_id"], warning["log_level"]) == (
        bad_seq,
        bad,
        "warning",
    )
    assert "lower case" in warning["reason"]
    stored = dict(h.rows("SELECT id, traceparent FROM herald_events"))
    assert stored == {traced: TRACEPARENT, bad: None, plain: None, empty: None}
    for event_id, expected in ((traced, TRACEPARENT), (bad, None), (plain, None)):
        event = await h.store.get_event("default", event_id)
        assert event is not None
        assert event.traceparent == expected
        assert event.data.startswith(b"{")  # the payload bytes stay as they were
    claimed = await h.store.claim_due(
        now=2e9, limit=10, owner="it", lease_until=2e9 + 60
    )  # every delivery, through events_by_id
    assert {d.event.id: d.event.traceparent for d in claimed} == {
        traced: TRACEPARENT,
        bad: None,
        plain: None,
        empty: None,
    }


async def test_published_through_the_service_with_a_header(harness: Harness) -> None:
    h = harness
    good = await h.service.publish("default", "order.created", {"n": 1}, traceparent=TRACEPARENT)
    with structlog.testing.capture_logs() as logs:
        bad = await h.service.publish("default", "order.created", {"n": 2}, traceparent=INVALID)
    assert (good.traceparent, bad.traceparent) == (TRACEPARENT, None)
    assert [e["event_id"] for e in logs if e["event"] == "traceparent_ignored"] == [bad.id]
    assert await h.relay.run_once() == 2
    stored = dict(h.rows("SELECT id, traceparent FROM herald_events"))
    assert stored == {good.id: TRACEPARENT, bad.id: None}


async def test_the_receiver_gets_the_header_on_every_attempt_and_only_then(
    harness_factory: HarnessFactory, receivers: ReceiverFactory
) -> None:
    h = await harness_factory(delivery={"backoff_base_seconds": 0.05, "max_retries": 3})
    firsts: set[str] = set()

    def once_down(r: Received) -> web.StreamResponse:
        # Every event fails once: its retry reads the event back from the database.
        if r.event_id in firsts:
            return web.Response(status=204)
        firsts.add(r.event_id)
        return web.Response(status=503)

    rx = await receivers(once_down)
    # A custom header of that name goes when the event has its own, and stays otherwise.
    await h.add_webhook(rx.url, custom_headers='{"TraceParent": "custom"}')
    traced = await h.emit("order.created", {"n": 1}, traceparent=TRACEPARENT)
    plain = await h.emit("order.created", {"n": 2})
    async with running(h.dispatcher()):
        for event_id in (traced, plain):
            dlv = await only_delivery(h, event_id)
            done = await wait_for_delivery(
                h, dlv.id, lambda d: d.status is not DeliveryStatus.PENDING
            )
            assert (done.status, done.attempt_count) == (DeliveryStatus.SUCCESS, 2)
    assert rx.errors == []
    got: dict[str, list[Any]] = {}
    for r in rx.received:
        assert r.verified  # the signature does not cover it, and still verifies
        got.setdefault(r.event_id, []).append(r.headers.get("traceparent"))
    assert got == {traced: [TRACEPARENT, TRACEPARENT], plain: ["custom", "custom"]}


@pytest.mark.sqlite_only
async def test_the_publish_helper_writes_it(harness: Harness) -> None:
    h = harness
    with h.sqlite() as conn:
        event_id = publish(conn, "order.created", {"n": 1}, traceparent=TRACEPARENT)
    assert await h.relay.run_once() == 1
    event = await h.store.get_event("default", event_id)
    assert event is not None
    assert event.traceparent == TRACEPARENT


async def test_handed_over_by_the_relay_without_a_claim(
    harness: Harness, receivers: ReceiverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's in-memory hand-over to its dispatcher carries the event as parsed."""
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url)
    async with handing_over(h, monkeypatch, owner="it-traced") as (relay, claims):
        traced = h.produce("order.created", {"n": 1}, traceparent=TRACEPARENT)
        assert await relay.run_once() == 1
        await rx.wait_for(lambda: len(rx.received) == 1, what="the event")
    assert claims.claimed == []
    [got] = rx.received
    assert (got.event_id, got.headers.get("traceparent")) == (traced, TRACEPARENT)
    assert got.verified
