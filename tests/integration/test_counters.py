"""Per-destination counters, kept in the recording transaction, on SQLite and PostgreSQL.

Each recorded attempt moves its destination's last success or last failure and adds
to its hour; the failure rate sums the last 24 hours; concurrent recorders lose no
count; retention's purge deletes old hours.
"""

from __future__ import annotations

import asyncio
import time

from herald.ids import new_id
from herald.model import Attempt, AttemptRecord, DeliveryStatus, DueDelivery, Outcome
from herald.store import Store
from herald.store.counters import HOUR
from tests.integration.conftest import Harness, HarnessFactory

FAR = 10**10


def attempted(item: DueDelivery, *, ok: bool, at: float) -> AttemptRecord:
    """The record of one attempt of ``item`` started at ``at``."""
    attempt = Attempt(
        id=new_id("att_"),
        delivery_id=item.id,
        number=item.attempt_count + 1,
        started_at=at,
        duration_ms=1.0,
        outcome=Outcome.SUCCESS if ok else Outcome.TIMEOUT,
        response_status=204 if ok else None,
        error=None if ok else "timed out",
    )
    status = DeliveryStatus.SUCCESS if ok else DeliveryStatus.PENDING
    return AttemptRecord(attempt, status, None if ok else time.time() + 3600, None, item)


async def due(h: Harness, count: int, *, events: tuple[str, ...] = ("a.b",)) -> list[DueDelivery]:
    for _ in range(count):
        await h.emit(events[0])
    return await h.store.claim_due(now=time.time(), limit=1000, owner="w", lease_until=FAR)


async def test_attempts_move_the_last_times_and_the_failure_rate(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    quiet = await h.add_webhook("http://127.0.0.1:1/q", events=("c.d",))
    assert await h.store.destination_health([dest.id, quiet.id], now=time.time()) == {}
    items = await due(h, 5)
    now = time.time()
    # Three successes and a failure now; a failure 30 hours ago counts for the last
    # failure's time only if later, and never in the rate.
    await h.store.record_attempts([attempted(i, ok=True, at=now - 2) for i in items[:3]])
    await h.store.record_attempts([attempted(items[3], ok=False, at=now - 1)])
    await h.store.record_attempts([attempted(items[4], ok=False, at=now - 30 * HOUR)])
    health = await h.store.destination_health([dest.id, quiet.id], now=now)
    assert list(health) == [dest.id]
    got = health[dest.id]
    assert got.last_success_at is not None
    assert abs(got.last_success_at - (now - 2)) < 1e-3
    assert got.last_failure_at is not None
    assert abs(got.last_failure_at - (now - 1)) < 1e-3
    assert (got.successes, got.failures, got.failure_rate) == (3, 1, 0.25)
    hours = await h.store.destination_hours(dest.id, now=now)
    assert sum(x.successes for x in hours) == 3
    assert sum(x.failures for x in hours) == 1
    assert all(x.hour > (now - 24 * HOUR) // HOUR for x in hours)
    # 25 hours on, nothing is in the rate but the last times stay.
    later = await h.store.destination_health([dest.id], now=now + 25 * HOUR)
    assert (later[dest.id].successes, later[dest.id].failure_rate) == (0, None)
    assert later[dest.id].last_success_at == got.last_success_at


async def test_concurrent_recorders_lose_no_count(harness_factory: HarnessFactory) -> None:
    """Two stores record attempts of two destinations at once, in opposite orders: on
    PostgreSQL each upserts the counters last and in destination order, so neither
    waits on the other in a circle and every attempt is counted."""
    h = await harness_factory()
    a = await h.add_webhook("http://127.0.0.1:1/a", events=("a.b",))
    b = await h.add_webhook("http://127.0.0.1:1/b", events=("a.b",))
    items = await due(h, 30)
    assert {i.destination_id for i in items} == {a.id, b.id}
    now = time.time()
    other = h.new_store()
    await other.open()
    try:

        async def record_all(store: Store, mine: list[DueDelivery], *, ok: bool) -> None:
            for k in range(0, len(mine), 3):
                batch = [attempted(i, ok=ok, at=now) for i in mine[k : k + 3]]
                await store.record_attempts(batch)

        await asyncio.gather(
            record_all(h.store, items[::2], ok=True),
            record_all(other, list(reversed(items[1::2])), ok=False),
        )
    finally:
        await other.close()
    health = await h.store.destination_health([a.id, b.id], now=now)
    assert sum(x.successes for x in health.values()) == 30
    assert sum(x.failures for x in health.values()) == 30
    for dest in (a, b):
        ok = sum(i.destination_id == dest.id for i in items[::2])
        failed = sum(i.destination_id == dest.id for i in items[1::2])
        assert (health[dest.id].successes, health[dest.id].failures) == (ok, failed)


async def test_the_purge_deletes_old_hours_only(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:1/", events=("a.b",))
    items = await due(h, 2)
    now = time.time()
    await h.store.record_attempts([attempted(items[0], ok=False, at=now - 10 * 24 * HOUR)])
    await h.store.record_attempts([attempted(items[1], ok=True, at=now)])
    assert h.scalar("SELECT COUNT(*) FROM herald_destination_hours") == 2
    await h.store.purge(before=now - 24 * HOUR, limit=100)
    assert h.rows("SELECT hour FROM herald_destination_hours") == [(int(now // HOUR),)]
    # The last times are one row per destination, never purged.
    health = await h.store.destination_health([dest.id], now=now)
    assert health[dest.id].last_failure_at is not None
