"""Operational events (``herald.…``) against a real database, on SQLite and PostgreSQL.

The recording transaction keeps each destination's consecutive failures and failing
episode and writes the operational events it causes into the outbox; the relay fans
them out to the tenant's destinations that name them, never to the destination they
are about, never through ``*``. Producers cannot publish the reserved types.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from herald.errors import ValidationError
from herald.ids import new_id
from herald.ingest import about_destination
from herald.model import (
    DELIVERY_EXHAUSTED,
    DESTINATION_FAILING,
    DESTINATION_RECOVERED,
    VERIFICATION_FAILED,
    Attempt,
    AttemptRecord,
    DeliveryStatus,
    DestinationStatus,
    DueDelivery,
    Outcome,
    Recorded,
)
from herald.store import Store
from herald.views import verification_view
from tests.integration.conftest import (
    Harness,
    HarnessFactory,
    closed_port,
    eventually,
    insert_outbox_row,
    running,
)

FAR = 10**10


def outcome_of(
    item: DueDelivery,
    *,
    ok: bool,
    final: bool = False,
    number: int | None = None,
) -> AttemptRecord:
    """The record of one attempt of ``item``: a success, a failure to retry, or (final)
    the failure that exhausts it."""
    attempt = Attempt(
        id=new_id("att_"),
        delivery_id=item.id,
        number=item.attempt_count + 1 if number is None else number,
        started_at=time.time(),
        duration_ms=1.0,
        outcome=Outcome.SUCCESS if ok else Outcome.FAILURE_RETRYABLE,
        response_status=204 if ok else 503,
        error=None if ok else "HTTP 503",
    )
    if ok:
        return AttemptRecord(attempt, DeliveryStatus.SUCCESS, None, None, item)
    if final:
        return AttemptRecord(attempt, DeliveryStatus.FAILURE, None, None, item)
    return AttemptRecord(attempt, DeliveryStatus.PENDING, time.time() + 3600, None, item)


async def claim(h: Harness, *, store: Store | None = None) -> list[DueDelivery]:
    store = store or h.store
    return await store.claim_due(now=time.time(), limit=1000, owner="w", lease_until=FAR)


def signals_in_outbox(h: Harness) -> list[tuple[str, str, str | None, dict[str, Any]]]:
    """(id, type, about, data) of the operational events waiting in the outbox."""
    return [
        (
            r[0],
            r[1],
            about_destination(r[2]),
            r[3] if isinstance(r[3], dict) else orjson.loads(r[3]),
        )
        for r in h.rows(
            "SELECT id, type, about_destination, data FROM herald_outbox"
            " WHERE type LIKE 'herald.%' ORDER BY seq"
        )
    ]


def state(h: Harness, dest_id: str) -> tuple[int, bool]:
    count, since = h.rows(
        "SELECT consecutive_failures, failing_since FROM herald_destinations WHERE id = ?",
        (dest_id,),
    )[0]
    return int(count), since is not None


async def test_failures_open_one_episode_and_the_next_success_closes_it(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(signals={"failing_after_attempts": 3})
    broken = await h.add_webhook("http://127.0.0.1:1/broken", events=("a.b", "herald.*"))
    monitor = await h.add_webhook("http://127.0.0.1:1/monitor", events=("herald.*",))
    everything = await h.add_webhook("http://127.0.0.1:1/all", events=("*",))
    monitor_of_failing = await h.add_webhook(
        "http://127.0.0.1:1/f", events=("herald.destination.failing",)
    )
    for _ in range(5):
        await h.emit("a.b")
    items = [i for i in await claim(h) if i.destination_id == broken.id]
    assert len(items) == 5

    for n, item in enumerate(items[:4], start=1):
        await h.store.record_attempts([outcome_of(item, ok=False)])
        assert state(h, broken.id) == (n, n >= 3)
    [(event_id, type_, about, data)] = signals_in_outbox(h)
    assert (type_, about) == (DESTINATION_FAILING, broken.id)
    assert data["destination_id"] == broken.id
    assert data["consecutive_failures"] == 3
    assert data["last_error"] == "HTTP 503"
    assert await h.store.failing_count() == 1
    got = await h.store.get_destination("default", broken.id)
    assert got is not None
    assert got.failing_since is not None

    # The relay fans it out: to the monitors, not to "*", not to the destination itself.
    assert await h.relay.run_once() == 1
    fanned = await h.deliveries(event_types=(DESTINATION_FAILING,))
    assert sorted(d.destination_id for d in fanned) == sorted([monitor.id, monitor_of_failing.id])
    assert all(d.event_id == event_id for d in fanned)
    assert everything.id not in {d.destination_id for d in fanned}

    recovered = await h.store.record_attempts([outcome_of(items[4], ok=True)])
    assert [s.type for s in recovered.signals] == [DESTINATION_RECOVERED]
    assert state(h, broken.id) == (0, False)
    [(_, type_, about, data)] = signals_in_outbox(h)
    assert (type_, about) == (DESTINATION_RECOVERED, broken.id)
    assert data["consecutive_failures"] == 4
    assert await h.store.failing_count() == 0
    assert await h.relay.run_once() == 1
    [to_monitor] = await h.deliveries(event_types=(DESTINATION_RECOVERED,))
    assert to_monitor.destination_id == monitor.id


async def test_a_success_before_the_threshold_resets_the_count_silently(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(signals={"failing_after_attempts": 2})
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    for _ in range(3):
        await h.emit("a.b")
    one, two, three = await claim(h)
    # In one batch, in order: a failure, a success, a failure: never two in a row.
    done = await h.store.record_attempts(
        [outcome_of(one, ok=False), outcome_of(two, ok=True), outcome_of(three, ok=False)]
    )
    assert done.signals == []
    assert state(h, dest.id) == (1, False)
    assert signals_in_outbox(h) == []


async def test_an_exhausted_delivery_signals_once_with_its_cause(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    monitor = await h.add_webhook("http://127.0.0.1:1/m", events=("herald.delivery.exhausted",))
    event_id = await h.emit("a.b")
    [item] = await claim(h)
    final = outcome_of(item, ok=False, final=True, number=4)
    done = await h.store.record_attempts([final])
    assert done.exhausted == ["webhook"]
    [(signal_id, type_, about, data)] = signals_in_outbox(h)
    assert (type_, about) == (DELIVERY_EXHAUSTED, dest.id)
    assert signal_id == f"evt_delivery_exhausted_{item.id}_4"
    assert data == {
        "destination_id": dest.id,
        "destination_type": "webhook",
        "delivery_id": item.id,
        "event_id": event_id,
        "event_type": "a.b",
        "attempts": 4,
        "last_error": "HTTP 503",
        "last_response_status": 503,
        "last_outcome": "failure_retryable",
    }
    assert await h.relay.run_once() == 1
    [fanned] = await h.deliveries(event_types=(DELIVERY_EXHAUSTED,))
    assert fanned.destination_id == monitor.id
    # Its own exhaustion signals nothing more: no loop between failing monitors.
    [signal_item] = [i for i in await claim(h) if i.id == fanned.id]
    done = await h.store.record_attempts([outcome_of(signal_item, ok=False, final=True)])
    assert done.exhausted == ["webhook"]
    assert done.signals == []
    assert signals_in_outbox(h) == []


async def test_a_recording_written_twice_writes_each_signal_once(harness: Harness) -> None:
    """A commit whose acknowledgement was lost is retried (``retry_storage``): the
    event ids derive from the cause, so the retry writes nothing new, before or after
    the relay took the first copy."""
    h = harness
    if h.backend == "sqlite":
        pytest.skip("SQLite's commit is local: an acknowledgement cannot be lost")
    await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    await h.emit("a.b")
    [item] = await claim(h)
    final = outcome_of(item, ok=False, final=True)
    await h.store.record_attempts([final])
    await h.store.record_attempts([final])
    assert len(signals_in_outbox(h)) == 1
    assert await h.relay.run_once() == 1
    await h.store.record_attempts([final])
    assert signals_in_outbox(h) == []
    assert h.scalar("SELECT COUNT(*) FROM herald_events WHERE type LIKE 'herald.%'") == 1


async def test_a_delivery_ended_by_a_delete_signals_nothing(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    await h.emit("a.b")
    [item] = await claim(h)
    assert await h.store.delete_destination("default", dest.id, now=time.time())
    done = await h.store.record_attempts([outcome_of(item, ok=False, final=True)])
    assert (done.signals, done.exhausted) == ([], [])
    assert signals_in_outbox(h) == []


async def test_concurrent_recorders_count_every_failure_and_open_one_episode(
    harness_factory: HarnessFactory,
) -> None:
    """Two processes record failures of one destination at once: on PostgreSQL the row
    lock serialises them, so no increment is lost and the episode opens once."""
    h = await harness_factory(signals={"failing_after_attempts": 5})
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    for _ in range(24):
        await h.emit("a.b")
    items = await claim(h)
    other = h.new_store()
    await other.open()
    try:

        async def record_all(store: Store, mine: list[DueDelivery]) -> None:
            for item in mine:
                await store.record_attempts([outcome_of(item, ok=False)])

        await asyncio.gather(record_all(h.store, items[::2]), record_all(other, items[1::2]))
    finally:
        await other.close()
    assert state(h, dest.id) == (24, True)
    assert [t for _, t, _, _ in signals_in_outbox(h)] == [DESTINATION_FAILING]


async def test_a_verification_that_runs_out_shows_failed_and_signals(harness: Harness) -> None:
    h = harness
    monitor = await h.add_webhook("http://127.0.0.1:1/m", events=("herald.destination.*",))
    dest = await h.service.create(
        "default",
        {
            "name": "v",
            "type": "webhook",
            "events": ["herald.*"],
            "webhook": {"url": "http://127.0.0.1:1/v"},
        },
    )
    assert verification_view(dest)["state"] == "pending"
    [ping] = await claim(h)
    done = await h.store.record_attempts([outcome_of(ping, ok=False, final=True, number=11)])
    assert [s.type for s in done.signals] == [VERIFICATION_FAILED]
    assert done.exhausted == []
    got = await h.service.get("default", dest.id)
    assert got.status is DestinationStatus.PENDING_VERIFICATION
    assert verification_view(got) == {
        "state": "failed",
        "failed_at": verification_view(got)["failed_at"],
        "last_error": "HTTP 503",
        "reverify": f"POST /v2/event-destinations/{dest.id}/verify",
    }
    assert verification_view(got)["failed_at"] is not None
    [(signal_id, type_, about, data)] = signals_in_outbox(h)
    assert (signal_id, type_, about) == (
        f"evt_destination_verification_failed_{ping.id}",
        VERIFICATION_FAILED,
        dest.id,
    )
    assert data["attempts"] == 11
    assert data["reverify"] == f"POST /v2/event-destinations/{dest.id}/verify"
    await h.catalog.refresh()
    assert await h.relay.run_once() == 1
    # To the monitor; not to the destination it is about, though it names herald.*.
    fanned = await h.deliveries(event_types=(VERIFICATION_FAILED,))
    assert [d.destination_id for d in fanned] == [monitor.id]

    # A new ping is pending again; its success verifies.
    again = await h.service.verify("default", dest.id)
    assert verification_view(await h.service.get("default", dest.id))["state"] == "pending"
    assert again.status is DestinationStatus.PENDING_VERIFICATION
    [new_ping] = [i for i in await claim(h) if i.destination_id == dest.id]
    ok = outcome_of(new_ping, ok=True)
    ok.activates_destination = dest.id
    await h.store.record_attempts([ok])
    verified = await h.service.get("default", dest.id)
    assert verified.status is DestinationStatus.ACTIVE
    assert verification_view(verified) == {
        "state": "verified",
        "failed_at": None,
        "last_error": None,
        "reverify": None,
    }


async def test_producers_cannot_publish_operational_events(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:1/", events=("herald.*",))
    # The producer's plain INSERT: it gets past no check of Herald's own.
    insert_outbox_row(h.db, DESTINATION_FAILING, {"destination_id": "evtd_forged"})
    assert await h.relay.run_once() == 1
    [(reason,)] = h.rows("SELECT reason FROM herald_outbox_rejected")
    assert reason.startswith("reserved_type: event type 'herald.destination.failing' is reserved")
    assert await h.deliveries() == []
    with pytest.raises(ValidationError) as caught:
        await h.service.publish("default", DELIVERY_EXHAUSTED, {})
    assert caught.value.code == "event_type_reserved"
    if h.backend == "sqlite":
        with pytest.raises(ValueError, match="reserved"):
            h.produce(DESTINATION_RECOVERED, {})  # herald.outbox.publish


async def test_a_producer_cannot_pass_a_row_off_as_herald_s_own(harness: Harness) -> None:
    """``about_destination`` is a column of the producer's own table: set by hand, it
    once made a ``herald.`` row Herald's own (and kept an ordinary event from the
    destination it named). Only Herald's key marks its rows; these are rejected."""
    h = harness
    monitor = await h.add_webhook("http://127.0.0.1:1/monitor", events=("herald.*", "a.b"))
    forged = [
        ("evt_forged_failing", DESTINATION_FAILING, {"destination_id": "evtd_x"}, "evtd_x"),
        ("evt_forged_skip", "a.b", {}, monitor.id),
    ]
    for event_id, type_, data, about in forged:
        h.db.execute(
            "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, about_destination)"
            " VALUES (?, 'default', ?, ?, ?, ?)",
            (event_id, type_, orjson.dumps(data).decode(), "2026-11-28T00:00:00Z", about),
        )
    assert await h.relay.run_once() == 2
    reasons = [r for (r,) in h.rows("SELECT reason FROM herald_outbox_rejected ORDER BY seq")]
    assert len(reasons) == 2
    assert all(r.startswith("about_destination_refused: ") for r in reasons), reasons
    assert await h.deliveries() == []


async def test_the_engine_s_own_attempts_signal(harness_factory: HarnessFactory) -> None:
    """Attempts made in this process (``herald.attempt``) carry their delivery to the
    recorder: a dead receiver's failures open an episode and exhaust the delivery."""
    h = await harness_factory(
        delivery={"backoff_base_seconds": 0.01, "max_retries": 2},
        signals={"failing_after_attempts": 2},
    )
    dead = await h.add_webhook(f"http://127.0.0.1:{closed_port()}/hook", events=("a.b",))
    seen: list[Recorded] = []
    dispatcher = h.dispatcher()
    dispatcher.recorder._on_recorded = seen.append
    await h.emit("a.b")
    async with running(dispatcher):
        await eventually(
            lambda: asyncio.sleep(0, len(signals_in_outbox(h)) == 2), what="two signals"
        )
    assert [(t, about) for _, t, about, _ in signals_in_outbox(h)] == [
        (DESTINATION_FAILING, dead.id),
        (DELIVERY_EXHAUSTED, dead.id),
    ]
    assert state(h, dead.id) == (3, True)
    assert [t for r in seen for t in r.exhausted] == ["webhook"]


async def test_a_superseded_verification_that_runs_out_signals_nothing(harness: Harness) -> None:
    h = harness
    dest = await h.service.create(
        "default",
        {
            "name": "v",
            "type": "webhook",
            "events": ["a.b"],
            "webhook": {"url": "http://127.0.0.1:1/"},
        },
    )
    [old_ping] = await claim(h)
    await h.service.verify("default", dest.id)  # a new ping supersedes the one in flight
    done = await h.store.record_attempts([outcome_of(old_ping, ok=False, final=True)])
    assert done.signals == []
    assert verification_view(await h.service.get("default", dest.id))["state"] == "pending"
