"""A lease outlives ``lease_seconds`` while its attempt runs, on both backends.

A dispatcher renews the leases of the deliveries it holds every third of
``lease_seconds``; another dispatcher on the same database (as another
instance would) must never take over a delivery whose attempt is still
running, however long that attempt takes.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from aiohttp import web

from herald.model import DeliveryStatus
from tests.integration.conftest import (
    Gate,
    Harness,
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


async def test_renewal_neither_waits_for_nor_deadlocks_with_a_recording(
    harness: Harness,
) -> None:
    # The recorder finishes a batch's deliveries in the order their attempts ended,
    # in one transaction; a renewal covers every lease the instance holds. A renewal
    # that waited for a row the recorder holds kept every other lease waiting too, and
    # deadlocked when the recorder then wanted a row the renewal had taken first (seen
    # as lease_renewal_failed under load, then leases running out: duplicate attempts).
    h = harness
    if h.backend == "sqlite":
        pytest.skip("SQLite has one writer at a time: no row locks to wait for")
    await h.add_webhook("http://127.0.0.1:1/a")
    for _ in range(2):
        await h.emit("a.b")
    now = time.time()
    claimed = await h.store.claim_due(now=now, limit=10, owner="a", lease_until=now + 30)
    first, last = sorted(d.id for d in claimed)
    recorder = await asyncpg.connect(h.database_url)
    try:
        recording = recorder.transaction()
        await recording.start()
        finish = "UPDATE herald_deliveries SET updated_at = $1 WHERE id = $2"
        await recorder.execute(finish, now, last)  # the batch's first attempt to end
        renewal = asyncio.create_task(
            h.store.renew_leases([first, last], owner="a", until=now + 60)
        )

        async def renewal_ended_or_waits() -> bool:
            waiting = await recorder.fetchval(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            return renewal.done() or waiting > 0

        await eventually(renewal_ended_or_waits, timeout=30, what="the renewal")
        # The recording goes on to its next row (a renewal that took it first and waits
        # for the recording's first row is a deadlock), and commits ...
        await asyncio.wait_for(recorder.execute(finish, now, first), timeout=30)
        await recording.commit()
        # ... and the renewal skipped the row being recorded (its lease ends as it is
        # recorded), without an error.
        assert await asyncio.wait_for(renewal, timeout=30) == 1
    finally:
        await recorder.close()
    leases = dict(h.rows("SELECT id, next_attempt_at FROM herald_deliveries"))
    assert leases == {first: now + 60, last: now + 30}
