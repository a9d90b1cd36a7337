"""The store's part for outbox sources, on both of Herald's databases: rows read from a
source become events (or rejections naming the source), a row relayed before a crash
is recognised when read again, and one instance at a time holds a source's lease."""

from __future__ import annotations

import time

import orjson

from herald.model import OutboxRow
from tests.integration.conftest import Harness


def row(seq: int, event_id: str, data: dict[str, int], type_: str = "order.placed") -> OutboxRow:
    return OutboxRow(
        seq=seq,
        id=event_id.encode(),
        tenant_id=None,
        type=type_.encode(),
        data=orjson.dumps(data),
        created_at=b"2026-01-02T03:04:05Z",
    )


async def test_rows_of_a_source_become_events_once(harness: Harness) -> None:
    h = harness
    await h.add_webhook("http://127.0.0.1:9/hook", events=["order.*"])
    batch = [row(1, "evt_src_1", {"n": 1}), row(2, "bad id", {"n": 2}), row(3, "evt_src_3", {})]
    done = await h.relay.relay_source("shop", batch)
    assert done is not None
    plan, relayed = done
    assert [e.id for e in plan.events] == ["evt_src_1", "evt_src_3"]
    assert relayed == []
    assert len(plan.deliveries) == 2
    [rejected] = await h.store.list_rejected(limit=10)
    assert (rejected["source"], rejected["seq"], rejected["id"]) == ("shop", 2, "bad id")

    # Read again after a crash lost the source's delete: known, not a duplicate_id.
    again = await h.relay.relay_source("shop", batch)
    assert again is not None
    plan, relayed = again
    assert [r.seq for r in relayed] == [1, 3]
    assert (plan.events, plan.deliveries) == ([], [])
    assert [str(r["reason"]).split(":")[0] for r in await h.store.list_rejected(limit=10)] == [
        "invalid_id"
    ]
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries") == 2

    # The same id with other content is a duplicate, rejected naming the source.
    clash = await h.relay.relay_source("shop", [row(9, "evt_src_1", {"n": 99})])
    assert clash is not None
    assert [r.reason.split(":")[0] for r in clash[0].rejected] == ["duplicate_id"]
    # A built-in outbox row rejected beside them keeps its own key (source, seq).
    h.db.execute(
        "INSERT INTO herald_outbox (seq, id, tenant_id, type, data, created_at)"
        " VALUES (2, 'not-evt', 'default', 'order.placed', '{}', '2026-01-02T03:04:05Z')"
    )
    await h.relay.run_once()
    keys = {(r["source"], r["seq"]) for r in await h.store.list_rejected(limit=10)}
    assert keys == {("herald", 2), ("shop", 2), ("shop", 9)}


async def test_one_instance_at_a_time_holds_a_source(harness: Harness) -> None:
    store = harness.store
    now = time.time()
    assert await store.source_lease("shop", "a", until=now + 10, now=now)
    assert not await store.source_lease("shop", "b", until=now + 10, now=now)
    assert await store.source_lease("shop", "a", until=now + 20, now=now + 1)  # renewed
    assert await store.source_lease("other", "b", until=now + 10, now=now)  # per source
    # Once a's lease has run out (killed), b takes the source over.
    assert await store.source_lease("shop", "b", until=now + 40, now=now + 21)
    assert not await store.source_lease("shop", "a", until=now + 50, now=now + 22)
    await store.source_release("shop", "b")
    assert await store.source_lease("shop", "a", until=now + 50, now=now + 22)
