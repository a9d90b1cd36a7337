"""Replays with ids, on both backends: a replay is stored once it re-queues, the
deliveries it re-queued carry its id (the latest replay owns one), and its outcome is
counted from them afterwards, from an index rather than the table."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from aiohttp import web

from herald.errors import NotFound
from herald.model import Delivery, DeliveryFilter, DeliveryStatus, ReplayOutcome
from herald.store.queries import load_queries
from tests.integration.conftest import (
    Harness,
    HarnessFactory,
    ReceiverFactory,
    eventually,
    running,
)
from tests.support.receiver import Received


async def settle(h: Harness) -> None:
    async def done() -> bool:
        return await h.deliveries(status=DeliveryStatus.PENDING) == []

    async with running(h.dispatcher()):
        await eventually(done, timeout=10, what="every delivery finished")


@dataclass
class Failed:
    h: Harness
    still_bad: set[str]
    """Events the receiver goes on failing; every other one now succeeds."""


@pytest.fixture
async def failed(harness_factory: HarnessFactory, receivers: ReceiverFactory) -> Failed:
    """Four event deliveries of tenant ``default``, all ``failure`` after one attempt."""
    h = await harness_factory(delivery={"max_retries": 0, "backoff_base_seconds": 0.01})
    bad: set[str] = set()
    failing = {"all": True}

    def flaky(item: Received) -> web.StreamResponse:
        no = item.type.startswith("order.") and (failing["all"] or item.event_id in bad)
        return web.Response(status=500 if no else 204)

    rx = await receivers(flaky)
    await h.add_webhook(rx.url)
    for type_ in ("order.created", "order.created", "order.created", "order.paid"):
        await h.emit(type_)
    await settle(h)
    assert len(await h.deliveries(status=DeliveryStatus.FAILURE)) == 4
    failing["all"] = False
    return Failed(h, bad)


async def test_a_replay_is_stored_carried_and_counted(failed: Failed) -> None:
    h = failed.h
    flt = DeliveryFilter(tenant_id="default", status=DeliveryStatus.FAILURE)

    dry = await h.service.replays.run(flt, dry_run=True, by="test:dry")
    assert (dry.matched, dry.requeued, dry.replay) == (4, 0, None)
    assert h.scalar("SELECT COUNT(*) FROM herald_replays") == 0
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries WHERE replay_id IS NOT NULL") == 0

    paid = (await h.deliveries(event_types=("order.paid",)))[0]
    failed.still_bad.add(paid.event_id)
    t0 = time.time()
    result = await h.service.replays.run(flt, by="test:ops")
    replay = result.replay
    assert replay is not None
    assert replay.id.startswith("rpl_")
    assert (replay.tenant_id, replay.by, replay.matched, replay.requeued) == (
        "default",
        "test:ops",
        4,
        4,
    )
    assert replay.filter == {"status": "failure"}
    assert replay.finished_at is not None
    assert t0 <= replay.finished_at <= time.time()

    stored = await h.service.replays.get("default", replay.id)
    assert stored.outcome == ReplayOutcome(pending=4)
    assert (stored.requeued, stored.finished_at) == (4, replay.finished_at)
    for d in await h.deliveries(kind=None):
        assert d.replay_id == (replay.id if d.kind.value == "event" else None)

    await settle(h)
    stored = await h.service.replays.get("default", replay.id)
    assert stored.outcome == ReplayOutcome(succeeded=3, failed=1)

    # A second replay of one of them takes it over: the first counts one less.
    again = await h.service.replays.run(
        DeliveryFilter(tenant_id="default", ids=(paid.id,)), by="test:ops"
    )
    assert again.replay is not None
    assert again.replay.filter == {"delivery_ids": [paid.id]}
    assert (await h.delivery(paid.id)).replay_id == again.replay.id
    first = await h.service.replays.get("default", replay.id)
    assert first.outcome == ReplayOutcome(succeeded=3)
    assert first.requeued == 4  # what it re-queued then stays recorded
    second = await h.service.replays.get("default", again.replay.id)
    assert second.outcome == ReplayOutcome(pending=1)
    owned = await h.service.list_deliveries(
        DeliveryFilter(tenant_id="default", replay_id=replay.id)
    )
    assert len(owned[0]) == 3
    assert paid.id not in {d.id for d in owned[0]}

    # A retry is not a replay: the delivery stays its latest replay's.
    await settle(h)
    await h.service.retry("default", paid.id)
    assert (await h.delivery(paid.id)).replay_id == again.replay.id

    # Newest first, outcomes included; a tenant sees only its own.
    listed, more = await h.service.replays.page("default")
    assert ([r.id for r in listed], more) == ([again.replay.id, replay.id], False)
    assert listed[1].outcome == ReplayOutcome(succeeded=3)
    page, more = await h.service.replays.page("default", limit=1)
    assert ([r.id for r in page], more) == ([again.replay.id], True)
    page, more = await h.service.replays.page("default", before_id=again.replay.id, limit=1)
    assert ([r.id for r in page], more) == ([replay.id], False)
    assert await h.service.replays.page("globex") == ([], False)
    with pytest.raises(NotFound) as refused:
        await h.service.replays.get("globex", replay.id)
    assert refused.value.code == "replay_not_found"
    assert (await h.service.replays.get(None, replay.id)).id == replay.id


async def test_an_operator_wide_replay_has_no_tenant_and_no_tenant_sees_it(
    failed: Failed,
) -> None:
    h = failed.h
    result = await h.service.replays.run(
        DeliveryFilter(event_types=("order.created",), since=0.0), by="console:k1"
    )
    assert result.replay is not None
    assert (result.replay.tenant_id, result.requeued) == (None, 3)
    assert result.replay.filter == {
        "event_types": ["order.created"],
        "since": "1970-01-01T00:00:00.000000Z",
    }
    with pytest.raises(NotFound):
        await h.service.replays.get("default", result.replay.id)
    assert await h.service.replays.page("default") == ([], False)
    everyone, _ = await h.service.replays.page(None)
    assert [r.id for r in everyone] == [result.replay.id]
    assert everyone[0].outcome == ReplayOutcome(pending=3)


async def test_a_replay_that_matches_nothing_is_stored_with_zero(harness: Harness) -> None:
    result = await harness.service.replays.run(DeliveryFilter(tenant_id="default"), by="t")
    assert result.replay is not None
    replay = await harness.service.replays.get("default", result.replay.id)
    assert (replay.matched, replay.requeued, replay.outcome) == (0, 0, ReplayOutcome())
    assert replay.finished_at is not None


async def test_the_outcome_count_reads_the_replay_index(harness: Harness) -> None:
    """``replay_outcomes`` can be answered from ``herald_deliveries_replay`` alone (a
    covering index of the re-queued deliveries only), never by scanning the table."""
    h = harness
    sql = load_queries("sqlite" if h.backend == "sqlite" else "postgres")["replay_outcomes"]
    if h.backend == "sqlite":
        plan = h.rows("EXPLAIN QUERY PLAN " + sql.replace("{ids}", "'rpl_x', 'rpl_y'"))
        details = " ".join(str(row[-1]) for row in plan)
        assert "COVERING INDEX herald_deliveries_replay" in details, details
    else:
        # A few rows make a sequential scan cheapest; forbid it to see what serves it.
        h.db.execute("SET enable_seqscan = off")
        plan = h.rows("EXPLAIN " + sql.replace("$1", "ARRAY['rpl_x', 'rpl_y']"))
        details = " ".join(str(row[0]) for row in plan)
        assert "herald_deliveries_replay" in details, details
        assert "Seq Scan" not in details, details


async def test_retention_forgets_a_replay_once_no_delivery_carries_it(failed: Failed) -> None:
    h = failed.h
    result = await h.service.replays.run(DeliveryFilter(tenant_id="default"), by="t")
    assert result.replay is not None
    await settle(h)
    h.db.execute("UPDATE herald_replays SET created_at = created_at - 7200")
    # Older than the cut-off, but its deliveries (finished since) are still there.
    await h.store.purge(before=time.time() - 3600, limit=1000)
    assert h.scalar("SELECT COUNT(*) FROM herald_replays") == 1
    # Once retention has taken them, it goes too.
    await h.store.purge(before=time.time() + 3600, limit=1000)
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries WHERE replay_id IS NOT NULL") == 0
    assert h.scalar("SELECT COUNT(*) FROM herald_replays") == 0


async def test_each_filter_requeues_exactly_the_event_deliveries_it_names(
    harness_factory: HarnessFactory, receivers: ReceiverFactory
) -> None:
    """What ``herald replay`` selects by (tests/e2e/test_replay.py runs the command on
    SQLite): each filter, alone or together, re-queues exactly the failed event
    deliveries it names on this database, never a verification; a dry run counts the
    same. Between filters the receiver fails them again."""
    h = await harness_factory(delivery={"max_retries": 0, "backoff_base_seconds": 0.01})
    rx = await receivers(
        lambda item: web.Response(status=500 if item.type.startswith("order.") else 204)
    )
    a = await h.add_webhook(rx.url, name="a")
    b = await h.add_webhook(rx.url, name="b")
    g = await h.add_webhook(rx.url, name="g", tenant="globex")
    for type_ in ("order.created", "order.created", "order.created", "order.paid", "order.paid"):
        await h.emit(type_)
    await settle(h)
    cut = time.time()
    late = await h.emit("order.created")
    for _ in range(2):
        await h.emit("order.created", tenant_id="globex")
    await settle(h)
    failed = await h.deliveries(status=DeliveryStatus.FAILURE)
    assert len(failed) == 14
    assert {d.kind.value for d in failed} == {"event"}

    def ids(keep: Callable[[Delivery], bool]) -> set[str]:
        return {d.id for d in failed if keep(d)}

    ids_of_a = sorted(ids(lambda d: d.destination_id == a.id))
    cases: list[tuple[DeliveryFilter, set[str]]] = [
        (
            DeliveryFilter(tenant_id="default", destination_id=b.id),
            ids(lambda d: d.destination_id == b.id),
        ),
        (
            DeliveryFilter(
                tenant_id="default", status=DeliveryStatus.FAILURE, event_types=("order.paid",)
            ),
            ids(lambda d: d.event_type == "order.paid"),
        ),
        (DeliveryFilter(tenant_id="default", since=cut), ids(lambda d: d.event_id == late)),
        (
            DeliveryFilter(tenant_id="default", until=cut, destination_id=a.id),
            ids(lambda d: d.destination_id == a.id and d.event_id != late),
        ),
        (DeliveryFilter(tenant_id="default", ids=tuple(ids_of_a[:2])), set(ids_of_a[:2])),
        (DeliveryFilter(tenant_id="globex"), ids(lambda d: d.destination_id == g.id)),
        (DeliveryFilter(tenant_id="default"), ids(lambda d: d.tenant_id == "default")),
        (DeliveryFilter(tenant_id="someone-else"), set()),
        (DeliveryFilter(status=DeliveryStatus.FAILURE), ids(lambda d: True)),  # every tenant's
    ]
    for flt, wanted in cases:
        dry = await h.service.replays.run(flt, dry_run=True, by="test")
        assert (dry.matched, dry.requeued) == (len(wanted), 0), flt
        result = await h.service.replays.run(flt, by="test")
        assert (result.matched, result.requeued) == (len(wanted), len(wanted)), flt
        pending = await h.deliveries(status=DeliveryStatus.PENDING)
        assert {d.id for d in pending} == wanted, flt
        await settle(h)
        assert len(await h.deliveries(status=DeliveryStatus.FAILURE)) == 14
