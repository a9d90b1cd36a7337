"""Ordered delivery per key in the store (docs/ordering.md), on both backends: only a
key's head is claimable, ending it releases the next, a recording whose lease a peer
took over does not end it, and a replay re-queues a key's deliveries behind what is
pending, in their first order."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson

from herald.ids import new_id
from herald.model import (
    Attempt,
    AttemptRecord,
    DeliveryStatus,
    DueDelivery,
    Outcome,
)
from tests.integration.conftest import Harness


def produce(h: Harness, key: str | None, n: int) -> str:
    event_id = f"evt_{key}_{n}_{new_id('')}"
    with h.sql() as db:
        db.execute(
            "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at, ordering_key)"
            " VALUES (?, 'default', 'order.step', ?, '2026-11-28T00:00:00Z', ?)",
            (event_id, orjson.dumps({"n": n}).decode(), key),
        )
    return event_id


def ended(item: DueDelivery, *, owner: str | None = None) -> AttemptRecord:
    attempt = Attempt(new_id("att_"), item.id, 1, time.time(), 1.0, Outcome.SUCCESS, 204)
    if owner is not None:
        item = replace(item, owner=owner)
    return AttemptRecord(attempt, DeliveryStatus.SUCCESS, None, None, item)


async def claim(h: Harness, owner: str = "me") -> list[DueDelivery]:
    now = time.time()
    return await h.store.claim_due(now=now + 1, limit=50, owner=owner, lease_until=now + 60)


async def test_one_head_per_key_released_in_order_fenced_and_replayed(harness: Harness) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:9/hook")
    await h.store.update_destination(replace(dest, ordering="key", updated_at=time.time()))
    await h.catalog.refresh()
    k = [produce(h, "k", n) for n in range(3)]
    j = produce(h, "j", 0)
    free = produce(h, None, 0)
    assert await h.relay.run_once() == 5

    first = await claim(h)
    assert sorted(d.event.id for d in first) == sorted([k[0], j, free])
    head = next(d for d in first if d.event.id == k[0])
    assert head.ordering_key == "k"
    assert head.event.ordering_key == "k"
    assert await claim(h) == []  # the rest of k waits behind its head

    # The head's lease ran out and a peer took it over: a late outcome does not end it.
    await h.store.record_attempts([ended(head, owner="someone-else")])
    assert (await h.delivery(head.id)).status is DeliveryStatus.PENDING
    assert await claim(h) == []
    # Its holder's outcome ends it, and releases the next of its key, only that one.
    await h.store.record_attempts([ended(head)])
    second = await claim(h)
    assert [d.event.id for d in second] == [k[1]]

    # A replay of the ended head: it joins k behind what is pending (k[1], k[2]).
    assert await h.store.requeue([head.id], now=time.time()) == 1
    await h.store.record_attempts([ended(second[0])])
    third = await claim(h)
    assert [d.event.id for d in third] == [k[2]]
    await h.store.record_attempts([ended(third[0])])
    assert [d.event.id for d in await claim(h)] == [k[0]]

    # Turning ordering off lets what waits go at once.
    for n in range(3, 6):
        produce(h, "k", n)
    assert await h.relay.run_once() == 3
    current = await h.store.get_destination(None, dest.id)
    assert current is not None
    await h.store.update_destination(replace(current, ordering="none", updated_at=time.time()))
    assert len(await claim(h)) == 3


async def test_blocked_keys_name_each_waiting_key_and_its_head(harness: Harness) -> None:
    """What the destination page's "Blocked keys" table reads: a key with deliveries
    waiting behind its head, the head (in flight once claimed) and how many wait; a key
    with nothing behind its head is not blocked."""
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:9/hook")
    await h.store.update_destination(replace(dest, ordering="key", updated_at=time.time()))
    await h.catalog.refresh()
    k = [produce(h, "k", n) for n in range(3)]
    produce(h, "j", 0)
    assert await h.relay.run_once() == 4

    [blocked] = await h.store.blocked_keys(dest.id, limit=10)
    assert (blocked.key, blocked.waiting, blocked.in_flight) == ("k", 2, False)
    head = (await h.delivery(blocked.head_id)).event_id
    assert head == k[0]

    claimed = await claim(h)
    [blocked] = await h.store.blocked_keys(dest.id, limit=10)
    assert (blocked.key, blocked.waiting, blocked.in_flight) == ("k", 2, True)
    # The head ends: the next is the head now, one behind it.
    k_head = next(d for d in claimed if d.event.id == k[0])
    await h.store.record_attempts([ended(k_head)])
    [blocked] = await h.store.blocked_keys(dest.id, limit=10)
    assert (blocked.key, blocked.waiting) == ("k", 1)
    assert (await h.delivery(blocked.head_id)).event_id == k[1]
