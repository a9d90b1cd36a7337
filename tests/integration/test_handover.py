"""Relay → dispatcher hand-over: new deliveries stored leased to this process's
dispatcher in the relay's transaction and started without a claim query; on both
backends, against real receivers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from herald.attempt import AttemptDone
from herald.dispatch import Dispatcher
from herald.handover import Room
from herald.ids import new_id
from herald.model import (
    DeliveryKind,
    DeliveryStatus,
    DestinationStatus,
    DueDelivery,
    NewDelivery,
    OutboxRow,
    RelayPlan,
)
from herald.outbox import Relay
from tests.integration.conftest import Harness, ReceiverFactory, eventually, running


def relay_for(h: Harness, dispatcher: Dispatcher, *, batch_size: int = 500) -> Relay:
    return Relay(
        h.store,
        h.catalog,
        h.policy,
        batch_size=batch_size,
        poll_interval=0.01,
        idle_poll=1.0,
        max_payload_bytes=h.settings.relay.max_payload_bytes,
        handover=dispatcher.handover,
    )


@asynccontextmanager
async def handing_over(
    h: Harness, monkeypatch: pytest.MonkeyPatch, *, owner: str
) -> AsyncIterator[tuple[Relay, CountingClaims]]:
    """A running dispatcher ready to take deliveries over, the relay that hands them
    to it, and the claims it makes meanwhile (none, when all goes over)."""
    claims = CountingClaims(h, monkeypatch)
    dispatcher = h.dispatcher(owner=owner)
    relay = relay_for(h, dispatcher)
    async with running(dispatcher):
        await eventually(
            lambda: _true(dispatcher.handover.room() is not None), what="dispatcher up"
        )
        yield relay, claims


class CountingClaims:
    """Wraps the store's claim query and counts the deliveries it returns."""

    def __init__(self, h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.claimed: list[str] = []
        original = h.store.claim_due

        async def claim_due(**kwargs: Any) -> list[DueDelivery]:
            due = await original(**kwargs)
            self.claimed.extend(d.id for d in due)
            return due

        monkeypatch.setattr(h.store, "claim_due", claim_due)


def test_room_takes_up_to_the_free_slots_and_the_per_destination_cap() -> None:
    room = Room("me", 100.0, free=3, outstanding={"busy": 2}, cap=2, tenant_load={}, tenant_cap=9)
    assert not room.take("busy", "t")  # at the cap already
    assert [room.take("a", "t"), room.take("a", "t"), room.take("a", "t")] == [True, True, False]
    assert room.take("b", "t")
    assert not room.take("c", "t")  # no free slot left
    assert room.outstanding == {"busy": 2, "a": 2, "b": 1}
    # A claim skips a destination with ``cap`` outstanding.
    assert [room.claimable(d, "t") for d in ("busy", "a", "b", "c")] == [False, False, True, True]


def test_room_takes_up_to_the_per_tenant_cap() -> None:
    room = Room(
        "me",
        100.0,
        free=10,
        outstanding={},
        cap=9,
        tenant_load={"busy": 3, "some": 1},
        tenant_cap=3,
    )
    assert not room.take("a", "busy")  # the tenant is at its cap already
    assert [room.take("b", "some"), room.take("c", "some"), room.take("b", "some")] == [
        True,
        True,
        False,
    ]
    assert room.take("d", "other")
    assert room.tenant_load == {"busy": 3, "some": 3, "other": 1}
    assert room.free == 7
    # A claim skips a tenant with ``tenant_cap`` outstanding.
    assert [room.claimable("x", t) for t in ("busy", "some", "other")] == [False, False, True]


async def test_the_relay_wakes_the_claims_only_for_what_a_claim_would_take(
    harness: Harness, receivers: ReceiverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries a batch leaves in the table wake the claim loop only when a claim
    could take one: not when each is held, or for a destination the dispatcher has
    enough of (the claim would skip them, after a scan past them)."""
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url, events=["a.*"], name="a")
    await h.add_webhook(rx.url, events=["c.*"], name="c")
    await h.add_webhook(rx.url, events=["*"], status=DestinationStatus.INACTIVE, name="off")
    dispatcher = h.dispatcher(owner="it-wake", max_per_destination=2, claim_batch=2)
    dispatcher.handover.open = True  # as while it runs; not started, so nothing is attempted
    monkeypatch.setattr(dispatcher.handover, "adopt", lambda due: True)
    wakes: list[None] = []
    relay = Relay(
        h.store,
        h.catalog,
        h.policy,
        batch_size=500,
        poll_interval=0.01,
        idle_poll=1.0,
        max_payload_bytes=h.settings.relay.max_payload_bytes,
        handover=dispatcher.handover,
        on_deliveries=lambda: wakes.append(None),
    )
    # Two of a's five go over leased (its cap); three stay for a claim that would
    # skip a (two outstanding is enough), and five are held for the inactive one.
    h.produce_many("a.x", [{"i": i} for i in range(5)])
    assert await relay.run_once() == 5
    assert wakes == []
    # One free slot: c gets one, and a claim would take c's other two.
    monkeypatch.setattr(dispatcher.handover, "free", lambda: 1)
    h.produce_many("c.x", [{"i": i} for i in range(3)])
    assert await relay.run_once() == 3
    assert len(wakes) == 1
    now = time.time()
    due = await h.store.claim_due(now=now, limit=100, owner="other", lease_until=now + 60)
    assert len(due) == 3 + 2


async def test_deliveries_parked_behind_their_destination_use_no_global_room(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    """Beyond ``max_per_destination`` a destination's deliveries wait behind it and
    take none of the global budget (twice ``max_concurrency``); as they finish, the
    budget stays until the destination is back under its limit."""
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url, events=["a.*"])
    out: list[tuple[DueDelivery, AttemptDone]] = []
    dispatcher = Dispatcher(
        h.store,
        h.catalog,
        h.policy,
        h.limits(max_concurrency=4, max_per_destination=2, claim_batch=8),
        owner="it-parked",
        submit=lambda item, done: out.append((item, done)),
    )
    dispatcher.handover.open = True  # as while it runs: the relay hands over
    relay = relay_for(h, dispatcher)

    def free() -> int:
        room = dispatcher.handover.room()
        return 0 if room is None else room.free

    assert free() == 8
    h.produce_many("a.x", [{"i": i} for i in range(6)])
    assert await relay.run_once() == 6
    assert (len(out), dispatcher.inflight) == (2, 6)  # two run, four parked
    assert free() == 6

    def finish_one() -> None:
        item, done = out.pop(0)
        done(item, asyncio.CancelledError())  # an outcome without a record

    frees = []
    for _ in range(6):
        finish_one()
        frees.append(free())
    # Four parked ones end first (the next ones start in their place), then the two.
    assert frees == [6, 6, 6, 6, 7, 8]
    assert dispatcher.inflight == 0


async def test_relayed_deliveries_are_attempted_without_a_claim(
    harness: Harness, receivers: ReceiverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url, events=["order.*"])
    async with handing_over(h, monkeypatch, owner="it-handover") as (relay, claims):
        ids = h.produce_many("order.created", [{"i": i} for i in range(50)])
        assert await relay.run_once() == 50
        # Stored leased to the dispatcher, in the relay's transaction.
        owners = h.rows("SELECT DISTINCT lease_owner FROM herald_deliveries WHERE kind = 'event'")
        assert owners in ([("it-handover",)], [(None,)])  # None: some already recorded

        async def all_done() -> bool:
            done = await h.deliveries(status=DeliveryStatus.SUCCESS)
            return len(done) == 50

        await eventually(all_done, what="50 successes")
    assert sorted(r.event_id for r in rx.received) == sorted(ids)
    assert claims.claimed == []
    for d in await h.deliveries():
        assert (d.status, d.attempt_count) == (DeliveryStatus.SUCCESS, 1)
    assert h.rows("SELECT DISTINCT lease_owner FROM herald_deliveries") == [(None,)]


async def test_no_hand_off_beyond_the_room_or_to_held_destinations(
    harness: Harness, receivers: ReceiverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five slots: five deliveries go over leased, the rest wait for a claim; a held
    (inactive) destination's deliveries are stored held, never leased."""
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url, events=["order.*"])
    inactive = await h.add_webhook(
        rx.url, events=["order.*"], status=DestinationStatus.INACTIVE, name="off"
    )
    claims = CountingClaims(h, monkeypatch)
    dispatcher = h.dispatcher(owner="it-small", max_concurrency=1, max_per_destination=1)
    dispatcher.handover.open = True  # as while it runs; not started, so nothing is attempted
    monkeypatch.setattr(dispatcher.handover, "free", lambda: 5)
    adopted: list[DueDelivery] = []

    def adopt(due: list[DueDelivery]) -> bool:
        adopted.extend(due)
        return True

    monkeypatch.setattr(dispatcher.handover, "adopt", adopt)
    relay = relay_for(h, dispatcher)
    h.produce_many("order.created", [{"i": i} for i in range(20)])
    assert await relay.run_once() == 20
    assert len(adopted) == 5
    assert {d.event.type for d in adopted} == {"order.created"}
    leased = h.rows("SELECT id FROM herald_deliveries WHERE lease_owner = 'it-small'")
    assert sorted(r[0] for r in leased) == sorted(d.id for d in adopted)
    held = h.rows(
        "SELECT held, lease_owner FROM herald_deliveries WHERE destination_id = ?", (inactive.id,)
    )
    assert len(held) == 20
    assert set(held) == {(1, None)}
    # The other fifteen are due now for any claim.
    now = time.time()
    due = await h.store.claim_due(now=now, limit=100, owner="other", lease_until=now + 60)
    assert len(due) == 15
    assert not {d.id for d in due} & {d.id for d in adopted}
    assert len(claims.claimed) == 15


async def test_a_stopped_dispatcher_gets_nothing_leased(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers()
    await h.add_webhook(rx.url, events=["order.*"])
    dispatcher = h.dispatcher(owner="it-stopped")
    assert dispatcher.handover.room() is None
    assert dispatcher.handover.adopt([]) is False
    relay = relay_for(h, dispatcher)
    h.produce_many("order.created", [{"i": 1}])
    assert await relay.run_once() == 1
    assert h.rows("SELECT lease_owner FROM herald_deliveries") == [(None,)]


async def test_each_tenants_event_of_a_shared_id_is_handed_over_with_its_delivery(
    harness: Harness, receivers: ReceiverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tenants' events of one id in one batch: each delivery handed over carries its
    own tenant's event (an event id is unique per tenant only)."""
    h = harness
    rx = await receivers()
    dests = {t: await h.add_webhook(rx.url, tenant=t, name=t) for t in ("acme", "globex")}
    dispatcher = h.dispatcher(owner="it-tenants")
    dispatcher.handover.open = True  # as while it runs; not started, so nothing is attempted
    adopted: list[DueDelivery] = []

    def adopt(due: list[DueDelivery]) -> bool:
        adopted.extend(due)
        return True

    monkeypatch.setattr(dispatcher.handover, "adopt", adopt)
    with h.sql() as db:
        for t in dests:
            h.produce("order.created", {"t": t}, db=db, tenant_id=t, id="evt_same")
    assert await relay_for(h, dispatcher).run_once() == 2
    tenant_of = {d.id: t for t, d in dests.items()}
    assert sorted(
        (tenant_of[d.destination_id], d.event.tenant_id, d.event.id, orjson.loads(d.event.data))
        for d in adopted
    ) == [(t, t, "evt_same", {"t": t}) for t in ("acme", "globex")]


async def test_the_store_unleases_what_the_committed_status_holds(harness: Harness) -> None:
    """A plan made from a catalog that saw the destination active while the database
    holds it (changed after the version check): stored held, unleased, due now; a
    delivery to a destination deleted meanwhile is not stored at all."""
    h = harness
    off = await h.add_webhook("http://127.0.0.1:9/off", status=DestinationStatus.INACTIVE)
    gone = await h.add_webhook("http://127.0.0.1:9/gone", name="gone")
    on = await h.add_webhook("http://127.0.0.1:9/on", name="on")
    assert await h.store.delete_destination("default", gone.id, now=time.time())
    h.produce_many("order.created", [{"i": 1}])
    lease_until = time.time() + 300
    ids = {name: new_id("dlv_") for name in ("off", "gone", "on")}

    def process(rows: list[OutboxRow], existing: set[tuple[str, str]]) -> RelayPlan:
        plan = h.relay.process(rows, existing)
        [event] = plan.events
        plan.deliveries = [
            NewDelivery(
                id=ids[name],
                tenant_id=event.tenant_id,
                event_id=event.id,
                event_type=event.type,
                destination_id=dest.id,
                kind=DeliveryKind.EVENT,
                max_attempts=11,
                next_attempt_at=lease_until,
                held=False,  # what a stale catalog would say
                created_at=time.time(),
                lease_owner="it-stale",
            )
            for name, dest in (("off", off), ("gone", gone), ("on", on))
        ]
        return plan

    before = time.time()
    plan, count = await h.store.relay(10, process)
    assert count == 1
    assert plan.leased == [ids["on"]]
    rows = {
        r[0]: r[1:]
        for r in h.rows("SELECT id, held, lease_owner, next_attempt_at FROM herald_deliveries")
    }
    assert set(rows) == {ids["off"], ids["on"]}
    held, owner, next_at = rows[ids["off"]]
    assert (held, owner) == (1, None)
    assert before <= next_at <= time.time()
    assert rows[ids["on"]] == (0, "it-stale", pytest.approx(lease_until))


async def _true(value: bool) -> bool:
    await asyncio.sleep(0)
    return value
