"""What the overview and the events list read, on SQLite and PostgreSQL: destinations
in a failing episode with their last error and failed attempts (from the recorder's
own writes), attempts per hour from the counters, each scoped to a tenant for the
portal; and the events list's order, filters and pages.
"""

from __future__ import annotations

import re
import time

import pytest

from herald.ids import new_id
from herald.model import Attempt, AttemptRecord, DeliveryStatus, DueDelivery, Outcome
from herald.store.queries import load_queries
from herald.store.recent import EventsPage
from tests.integration.conftest import Harness, HarnessFactory

FAR = 10**10


def failed(item: DueDelivery, *, status: int | None, error: str) -> AttemptRecord:
    attempt = Attempt(
        id=new_id("att_"),
        delivery_id=item.id,
        number=item.attempt_count + 1,
        started_at=time.time(),
        duration_ms=1.0,
        outcome=Outcome.FAILURE_RETRYABLE,
        response_status=status,
        error=error,
    )
    return AttemptRecord(attempt, DeliveryStatus.PENDING, time.time() + 3600, None, item)


async def test_the_overview_names_failing_destinations_with_their_last_error(
    harness_factory: HarnessFactory,
) -> None:
    h = await harness_factory(signals={"failing_after_attempts": 2})
    acme = await h.add_webhook("http://127.0.0.1:1/a", events=("a.b",), tenant="acme")
    globex = await h.add_webhook("http://127.0.0.1:1/g", events=("a.b",), tenant="globex")
    for tenant in ("acme", "acme", "acme", "globex"):
        await h.emit("a.b", tenant_id=tenant)
    items = await h.store.claim_due(now=time.time(), limit=100, owner="w", lease_until=FAR)
    mine = [i for i in items if i.destination_id == acme.id]
    theirs = [i for i in items if i.destination_id == globex.id]
    assert (len(mine), len(theirs)) == (3, 1)
    # Before any failure: nothing is failing, no attempt counted.
    calm = await h.service.overview()
    assert (calm.failing_now, calm.failed_attempts) == ([], 0)

    errors = ["HTTP 503", "HTTP 502", "HTTP 500: down"]
    for item, error in zip(mine, errors, strict=True):
        await h.store.record_attempts([failed(item, status=int(error[5:8]), error=error)])
    await h.store.record_attempts([failed(theirs[0], status=None, error="connection refused")])

    ov = await h.service.overview()
    # acme failed twice in a row and more: failing; globex once: not yet.
    assert [f.destination.id for f in ov.failing_now] == [acme.id]
    first = ov.failing_now[0]
    assert (first.destination.tenant_id, first.destination.name) == ("acme", acme.name)
    assert (first.destination.consecutive_failures, first.failed_attempts) == (3, 3)
    assert first.last is not None
    assert (first.last.error, first.last.response_status) == ("HTTP 500: down", 500)
    assert first.destination.failing_since <= time.time()
    assert (ov.attempts, ov.failed_attempts) == (4, 4)
    assert [(h.successes, h.failures) for h in ov.attempt_hours] == [(0, 4)]

    # The portal's: one tenant's destinations and attempts only.
    mine_ov = await h.service.overview(tenant_id="acme")
    theirs_ov = await h.service.overview(tenant_id="globex")
    assert [f.destination.id for f in mine_ov.failing_now] == [acme.id]
    assert theirs_ov.failing_now == []
    assert (mine_ov.failed_attempts, theirs_ov.failed_attempts) == (3, 1)
    assert (await h.service.overview(tenant_id="nobody")).attempt_hours == []

    # The last error: the newest delivery whose last attempt failed.
    last = await h.store.last_failed_attempt(globex.id)
    assert last is not None
    assert (last.error, last.response_status) == ("connection refused", None)
    assert await h.store.last_failed_attempt(new_id("evtd_")) is None


async def test_events_are_listed_newest_first_by_tenant_type_and_time(harness: Harness) -> None:
    h = harness
    ids = []
    for n, (tenant, type_) in enumerate(
        [("acme", "a.b"), ("acme", "c.d"), ("globex", "a.b"), ("acme", "a.b"), ("acme", "a.b")]
    ):
        ids.append(await h.emit(type_, {"n": n}, tenant_id=tenant))
    store = h.store

    async def listed(**kw: object) -> list[str]:
        args: dict[str, object] = {
            "tenant_id": None,
            "type": None,
            "since": None,
            "until": None,
            "after": None,
            "limit": 100,
            **kw,
        }
        return [e.id for e in await store.list_events(**args)]  # type: ignore[arg-type]

    assert await listed() == ids[::-1]
    assert await listed(tenant_id="acme") == [ids[4], ids[3], ids[1], ids[0]]
    assert await listed(tenant_id="acme", type="a.b") == [ids[4], ids[3], ids[0]]
    assert await listed(type="c.d") == [ids[1]]
    assert await listed(tenant_id="nobody") == []
    assert await listed(since=time.time() + 60) == []
    assert await listed(until=0.0) == []

    # Pages of two: each starts past the last one shown, through every event once.
    pages: list[str] = []
    after = None
    while True:
        page = await store.list_events(
            tenant_id=None, type=None, since=None, until=None, after=after, limit=2
        )
        pages += [e.id for e in page]
        if len(page) < 2:
            break
        after = EventsPage(page[-1].ingested_at, page[-1].id, page[-1].tenant_id)
    assert pages == ids[::-1]

    # One relay batch: the same ingested_at; the order falls back to the ids, and a
    # page boundary inside the batch loses and repeats nothing.
    same = [f"evt_same_{i}" for i in range(5)]
    for event_id in same:
        h.produce("e.f", {"n": 1}, id=event_id)
    assert await h.relay.run_once() == 5
    batch = await store.list_events(
        tenant_id=None, type="e.f", since=None, until=None, after=None, limit=10
    )
    assert len({e.ingested_at for e in batch}) == 1
    assert [e.id for e in batch] == sorted(same, reverse=True)
    cut = EventsPage(batch[1].ingested_at, batch[1].id, batch[1].tenant_id)
    rest = await store.list_events(
        tenant_id=None, type="e.f", since=None, until=None, after=cut, limit=10
    )
    assert [e.id for e in rest] == [e.id for e in batch[2:]]

    # The service's page: a limit and whether there is more; a bad type is refused.
    found, more = await h.service.recent_events("acme", limit=3)
    assert ([e.id for e in found], more) == ([ids[4], ids[3], ids[1]], True)
    with pytest.raises(Exception, match="type"):
        await h.service.recent_events(None, type="not a type!")


@pytest.mark.parametrize(
    ("query", "args", "index"),
    [
        ("failing_now", (None, 20), "herald_destinations_failing"),
        ("failing_now", ("acme", 20), "herald_destinations_failing"),
        ("last_failed_attempt", ("evtd_x",), "herald_deliveries_destination"),
        ("attempt_hours", (100,), "herald_destination_hours_hour"),
        ("tenant_attempt_hours", (100, "acme"), "herald_destination"),
        ("list_events", (None, None, 0.0, 1e18, None, None, 50), "herald_events_ingested"),
        # One tenant's: PostgreSQL takes herald_events_tenant_ingested (migration 0017),
        # SQLite the index its statement names; either is a walk by ingested_at.
        ("list_events", ("acme", "a.b", 0.0, 5.0, "evt_x", "acme", 50), "_ingested"),
    ],
)
def test_the_overview_and_the_events_list_read_indexes(
    harness: Harness, query: str, args: tuple[object, ...], index: str
) -> None:
    """Each read is answered from an index, never a walk of a whole table: on SQLite as
    the statement is written, on PostgreSQL with table scans made as costly as they get
    (on tables this small its planner would rightly rather read them whole)."""
    if harness.backend == "sqlite":
        sql = load_queries("sqlite")[query]
        plan = " | ".join(r[3] for r in harness.db.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert index in plan, plan
        assert not re.search(r"SCAN herald_\w+(?! USING)", plan), plan
        return
    sql = load_queries("postgres")[query]
    for n in range(len(args), 0, -1):
        value = args[n - 1]
        literal = (
            "NULL" if value is None else f"'{value}'" if isinstance(value, str) else repr(value)
        )
        sql = sql.replace(f"${n}", literal)
    with harness.db.transaction() as db:
        db.execute("SET LOCAL enable_seqscan = off")
        plan = " | ".join(r[0] for r in db.execute("EXPLAIN " + sql))
    assert index in plan, plan
    assert "Seq Scan" not in plan, plan
