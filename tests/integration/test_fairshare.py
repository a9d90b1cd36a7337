"""Fair share between tenants, on both backends: one tenant's hanging receivers hold at
most ``max_per_tenant`` slots, its backlog does not keep another tenant's deliveries
out of the claims or the hand-over, and a tenant has at most
``api.max_destinations_per_tenant`` destinations."""

from __future__ import annotations

import time

import pytest

from herald.dispatch import Dispatcher
from herald.errors import ValidationError
from herald.model import DeliveryStatus
from herald.outbox import Relay
from herald.service import Operations
from tests.integration.conftest import (
    Gate,
    Harness,
    HarnessFactory,
    ReceiverFactory,
    eventually,
    running,
)
from tests.integration.test_dispatch import Tracker

HUNG, HEALTHY = "hung", "healthy"
LIMITS = {
    "max_concurrency": 8,
    "max_per_tenant": 4,
    "max_per_destination": 4,
    # Small: a tenant's load reaches it at once, so the claims skip the hung tenant.
    "claim_batch_size": 4,
    "webhook_timeout_seconds": 120.0,  # the hung receivers hold on until the test ends
    "shutdown_grace_seconds": 0.2,
}


async def hung_and_healthy(
    h: Harness, receivers: ReceiverFactory, gate: Gate
) -> tuple[Tracker, str]:
    """Five destinations of one tenant whose receiver never answers (while the test
    runs), one of another tenant that answers at once; the hung tenant's 50 events
    (250 deliveries) first in due order, then the healthy one's 20. Returns the hung
    receiver's tracker and the healthy destination's id."""
    tracker = Tracker(gate, 120.0)
    hung_rx = await receivers(tracker)
    healthy_rx = await receivers()
    for n in range(5):
        await h.add_webhook(hung_rx.url, tenant=HUNG, name=f"hung{n}")
    healthy = await h.add_webhook(healthy_rx.url, tenant=HEALTHY)
    with h.sql() as db:
        for i in range(50):
            h.produce("thing.happened", {"i": i}, db=db, tenant_id=HUNG)
    with h.sql() as db:
        for i in range(20):
            h.produce("thing.happened", {"i": i}, db=db, tenant_id=HEALTHY)
    return tracker, healthy.id


async def healthy_done(h: Harness, dest_id: str) -> None:
    async def done() -> bool:
        ok = await h.deliveries(destination_id=dest_id, status=DeliveryStatus.SUCCESS)
        return len(ok) == 20

    # Without the per-tenant cap the hung tenant holds all 8 slots for 120 s.
    await eventually(done, timeout=20, what="the healthy tenant's 20 deliveries")


async def test_a_tenant_with_hanging_receivers_does_not_starve_another(
    harness_factory: HarnessFactory, receivers: ReceiverFactory, gate: Gate
) -> None:
    h = await harness_factory(delivery=LIMITS)
    tracker, healthy = await hung_and_healthy(h, receivers, gate)
    assert await h.relay.run_once() == 70
    dispatcher = h.dispatcher(owner="it-fair")
    async with running(dispatcher):
        await healthy_done(h, healthy)
        assert tracker.current == 4  # the hung tenant holds its share, no more
    assert tracker.peak == 4
    hung = await h.deliveries(status=DeliveryStatus.PENDING)
    assert len(hung) == 250
    assert {d.destination_id for d in hung}.isdisjoint({healthy})


async def test_the_hand_over_leaves_a_saturated_tenants_deliveries_to_the_claims(
    harness_factory: HarnessFactory, receivers: ReceiverFactory, gate: Gate
) -> None:
    """The relay hands new deliveries to the dispatcher within the same limits: the hung
    tenant's beyond its load stay in the table, the healthy tenant's go over."""
    h = await harness_factory(delivery=LIMITS)
    dispatcher = h.dispatcher(owner="it-fair-handover")
    relay = Relay(
        h.store,
        h.catalog,
        h.policy,
        batch_size=500,
        poll_interval=0.01,
        idle_poll=1.0,
        max_payload_bytes=h.settings.relay.max_payload_bytes,
        handover=dispatcher.handover,
    )
    async with running(dispatcher):

        async def open_() -> bool:
            return dispatcher.handover.room() is not None

        await eventually(open_, what="dispatcher up")
        tracker, healthy = await hung_and_healthy(h, receivers, gate)
        assert await relay.run_once() == 70
        leased = h.rows(
            "SELECT tenant_id, COUNT(*) FROM herald_deliveries WHERE lease_owner = ?"
            " GROUP BY tenant_id ORDER BY tenant_id",
            ("it-fair-handover",),
        )
        # Handed over: the hung tenant's up to its claim threshold (the claims skip it
        # from there), the healthy one's as far as the room goes.
        assert dict(leased).get(HUNG) == 4, leased
        await healthy_done(h, healthy)
        assert tracker.current == 4
    assert tracker.peak == 4


async def test_a_claim_skips_the_tenants_it_is_told_to(harness: Harness) -> None:
    h = harness
    for tenant in ("t1", "t2", "t3"):
        await h.add_webhook("http://127.0.0.1:9/", tenant=tenant, name=tenant)
        with h.sql() as db:
            for i in range(3):
                h.produce("thing.happened", {"i": i}, db=db, tenant_id=tenant)
    assert await h.relay.run_once() == 9
    now = time.time() + 1
    due = await h.store.claim_due(
        now=now, limit=100, owner="it-skip", lease_until=now + 60, exclude_tenants=["t1", "t3"]
    )
    assert sorted(d.event.tenant_id for d in due) == ["t2"] * 3
    rest = await h.store.claim_due(now=now, limit=100, owner="it-skip", lease_until=now + 60)
    assert sorted(d.event.tenant_id for d in rest) == ["t1"] * 3 + ["t3"] * 3


def body(n: int) -> dict[str, object]:
    return {
        "name": f"hook{n}",
        "type": "webhook",
        "webhook": {"url": f"http://127.0.0.1:9/{n}"},
        "events": ["*"],
    }


async def test_a_tenant_has_at_most_max_destinations_per_tenant(harness: Harness) -> None:
    h = harness
    service = Operations(
        h.store, h.registry, h.policy, catalog=h.catalog, max_destinations_per_tenant=2
    )
    first = await service.create("full", body(1))
    await service.create("full", body(2))
    before = h.scalar("SELECT COUNT(*) FROM herald_destinations")
    with pytest.raises(ValidationError) as err:
        await service.create("full", body(3))
    assert err.value.code == "destination_limit_reached"
    assert err.value.status == 422
    assert "2 event destinations" in err.value.message
    assert h.scalar("SELECT COUNT(*) FROM herald_destinations") == before  # nothing stored
    await service.create("other", body(4))  # another tenant has its own count
    await service.delete("full", first.id)  # a deleted one does not count
    await service.create("full", body(5))


def test_the_dispatcher_takes_the_tenant_cap_from_the_settings(harness: Harness) -> None:
    assert harness.limits().max_per_tenant == harness.settings.delivery.tenant_cap
    d = Dispatcher(harness.store, harness.catalog, harness.policy, harness.limits(), owner="x")
    assert d.handover.tenant_cap == max(
        harness.settings.delivery.tenant_cap, harness.settings.delivery.claim_batch_size
    )
