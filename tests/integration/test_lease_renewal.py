"""A lease outlives ``lease_seconds`` while its attempt runs, on both backends.

A dispatcher renews the leases of the deliveries it holds every third of
``lease_seconds``; another dispatcher on the same database (as another
instance would) must never take over a delivery whose attempt is still
running, however long that attempt takes.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from herald.model import DeliveryStatus
from tests.integration.conftest import (
    Gate,
    HarnessFactory,
    ReceiverFactory,
    eventually,
    running,
)
from tests.support.receiver import Received

LEASE = 1.0
SLOW = 4.0
"""How long the receiver takes to answer: four leases."""


async def test_a_long_attempt_keeps_its_lease_from_another_instance(
    harness_factory: HarnessFactory, receivers: ReceiverFactory, gate: Gate
) -> None:
    delivery = {"lease_seconds": LEASE, "webhook_timeout_seconds": 30.0}
    a = await harness_factory(delivery=delivery)
    assert a.settings.security.encryption_key is not None
    # The second instance: its own store, catalog and dispatcher on the same database,
    # with the same encryption key (it could decrypt the destination's secret too).
    b = await harness_factory(
        delivery=delivery,
        security={"encryption_key": a.settings.security.encryption_key.get_secret_value()},
    )
    started: list[float] = []

    async def slow(_: Received) -> web.StreamResponse:
        started.append(time.time())
        await gate.sleep(SLOW)
        return web.Response(status=204)

    rx = await receivers(slow)
    await a.add_webhook(rx.url)
    await b.catalog.refresh(force=True)
    event_id = await a.emit("order.created")
    [dlv] = [d for d in await a.deliveries() if d.event_id == event_id]

    def lease() -> tuple[str | None, float | None]:
        [(owner, until)] = a.rows(
            "SELECT lease_owner, next_attempt_at FROM herald_deliveries WHERE id = ?", (dlv.id,)
        )
        return owner, until

    async with running(a.dispatcher(owner="instance-a")):

        async def attempt_began() -> bool:
            return bool(started)

        await eventually(attempt_began, timeout=10, what="instance a's attempt")
        owner, first_until = lease()
        assert owner == "instance-a"
        assert first_until is not None
        # Instance b looks for due work every 50 ms while a's attempt runs for 4 leases.
        async with running(b.dispatcher(owner="instance-b")):
            renewed: list[float] = []
            while (done := await a.delivery(dlv.id)).status is DeliveryStatus.PENDING:
                owner, until = lease()
                if owner is not None:
                    assert owner == "instance-a", f"taken over by {owner}"
                    assert until is not None
                    assert until > time.time(), "the lease ran out while its attempt ran"
                    renewed.append(until)
                assert time.time() - started[0] < SLOW + 10, "the slow attempt never ended"
                await asyncio.sleep(0.1)
    assert done.status is DeliveryStatus.SUCCESS
    [attempt] = done.attempts  # exactly one attempt recorded
    assert attempt.duration_ms > 3 * LEASE * 1000
    assert len(started) == 1, f"the receiver was called {len(started)} times"
    # The lease was renewed while the attempt ran: it ended well after the first one.
    assert max(renewed) > first_until + LEASE
    assert a.rows("SELECT lease_owner FROM herald_deliveries WHERE id = ?", (dlv.id,)) == [(None,)]
