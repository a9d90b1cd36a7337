"""The store's part of the console: operator keys, sessions, the overview's counts."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest

import herald.events as events_module
from herald.access.keys import (
    OPERATOR_KIND,
    OPERATOR_TENANT,
    TENANT_KIND,
    Keys,
    hash_api_key,
    new_api_key,
)
from herald.access.sessions import Sessions
from herald.errors import NotFound
from herald.model import DeliveryFilter, DeliveryStatus, Destination, Outcome
from herald.overview import Overview
from herald.store.queries import load_queries
from tests.integration.conftest import Harness
from tests.integration.test_store import destination, record


async def test_an_operator_key_opens_no_tenant_and_a_tenant_key_no_console(
    harness: Harness,
) -> None:
    store = harness.store
    op, tenant = new_api_key(operator=True), new_api_key()
    assert op.startswith("sk_op_")
    assert tenant.startswith("sk_live_")
    await store.create_api_key(
        key_hash=hash_api_key(op),
        tenant_id=OPERATOR_TENANT,
        hint=op[-4:],
        now=1.0,
        kind=OPERATOR_KIND,
    )
    await store.create_api_key(key_hash=hash_api_key(tenant), tenant_id="acme", hint="t", now=2.0)
    found = await store.api_key(hash_api_key(op))
    assert found is not None
    assert (found.kind, found.tenant_id, found.hint) == (OPERATOR_KIND, OPERATOR_TENANT, op[-4:])
    found = await store.api_key(hash_api_key(tenant))
    assert found is not None
    assert (found.kind, found.tenant_id) == (TENANT_KIND, "acme")
    assert [k.kind for k in await store.list_api_keys(OPERATOR_TENANT, kind=OPERATOR_KIND)] == [
        OPERATOR_KIND
    ]
    assert await store.list_api_keys(OPERATOR_TENANT) == []  # no tenant key of tenant ''
    # Revoking by kind: a tenant revoke cannot reach an operator key.
    assert await store.revoke_api_keys(tenant_id=OPERATOR_TENANT, hash_prefix="", now=3.0) == 0
    assert (
        await store.revoke_api_keys(
            tenant_id=OPERATOR_TENANT, hash_prefix=hash_api_key(op)[:8], now=3.0, kind=OPERATOR_KIND
        )
        == 1
    )
    assert await store.api_key(hash_api_key(op)) is None


async def test_sessions_expire_and_end_with_their_key(harness: Harness) -> None:
    store = harness.store
    op = new_api_key(operator=True)
    await store.create_api_key(
        key_hash=hash_api_key(op), tenant_id=OPERATOR_TENANT, hint="x", now=1.0, kind=OPERATOR_KIND
    )
    sessions = Sessions(store, harness.settings.console, keys=Keys(store))
    assert await sessions.sign_in("sk_live_not-an-operator-key") is None
    assert await sessions.sign_in("") is None
    signed = await sessions.sign_in(op)
    assert signed is not None
    session_id, key_id = signed
    assert key_id == hash_api_key(op)[:12]
    operator = await sessions.resolve(session_id)
    assert operator is not None
    assert operator.by == f"console:{key_id}"
    assert await sessions.resolve(session_id + "x") is None
    # Only the id's hash is stored.
    stored = await store.get_console_session(hash_api_key(session_id))
    assert stored is not None
    assert stored.key_hash == hash_api_key(op)
    # Idle too long: gone.
    sessions.idle = 0.0
    await store.touch_console_session(hash_api_key(session_id), now=time.time() - 1)
    assert await sessions.resolve(session_id) is None
    assert await store.get_console_session(hash_api_key(session_id)) is None
    # Past its lifetime: gone, whatever its use.
    sessions.idle = 3600.0
    second, _ = await sessions.sign_in(op) or ("", "")
    sessions.lifetime = 0.0
    assert await sessions.resolve(second) is None
    # Signing out deletes the session.
    sessions.lifetime = 3600.0
    fourth, _ = await sessions.sign_in(op) or ("", "")
    live = await sessions.resolve(fourth)
    assert live is not None
    await sessions.sign_out(live.session_hash)
    assert await store.get_console_session(hash_api_key(fourth)) is None
    # Revoking the operator key ends its live sessions.
    sessions.lifetime = 3600.0
    third, _ = await sessions.sign_in(op) or ("", "")
    assert await sessions.resolve(third) is not None
    await store.revoke_api_keys(
        tenant_id=OPERATOR_TENANT, hash_prefix=hash_api_key(op), now=5.0, kind=OPERATOR_KIND
    )
    assert await sessions.resolve(third) is None


async def test_a_refused_sign_in_says_what_an_operator_can_act_on(harness: Harness) -> None:
    """Issue 31: one generic message for every refused key told an operator nothing."""
    store = harness.store
    sessions = Sessions(store, harness.settings.console, keys=Keys(store))
    op, other, tenant = new_api_key(operator=True), new_api_key(operator=True), new_api_key()
    await store.create_api_key(
        key_hash=hash_api_key(op), tenant_id=OPERATOR_TENANT, hint="x", now=1.0, kind=OPERATOR_KIND
    )
    await store.create_api_key(key_hash=hash_api_key(tenant), tenant_id="acme", hint="t", now=2.0)
    for key in ("", "password", "sk_op_", "sk_op_a b", "sk_op_" + "k" * 200, "Bearer " + op):
        assert await sessions.refused(key) == "not_a_key", key
    # Read off the prefix, as the API would tell by answering with the key.
    assert await sessions.refused(tenant) == "tenant_key"
    assert await sessions.refused("sk_live_never-made") == "tenant_key"
    assert await sessions.refused(other) == "unknown"  # never made here, or mistyped
    await store.revoke_api_keys(
        tenant_id=OPERATOR_TENANT, hash_prefix=hash_api_key(op), now=5.0, kind=OPERATOR_KIND
    )
    assert await sessions.sign_in(op) is None
    assert await sessions.refused(op) == "revoked"
    assert await sessions.refused(f"  {op}\n") == "revoked"  # pasted with whitespace


async def test_outcome_counts_bucket_finished_deliveries(harness: Harness) -> None:
    store = harness.store
    await store.create_destination(destination(), verification=None)
    await harness.catalog.refresh(force=True)
    for i in range(3):
        await harness.emit("order.created", {"n": i})
    pending = await store.list_deliveries(DeliveryFilter(), before_id=None, limit=10)
    assert len(pending) == 3
    since = time.time() - 1
    # Pending deliveries are no outcome yet.
    assert await store.outcome_counts(since=since, bucket_seconds=60) == []
    records = [
        record(
            pending[0].id, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS
        ),
        record(
            pending[1].id, 1, status=DeliveryStatus.SUCCESS, next_at=None, outcome=Outcome.SUCCESS
        ),
        record(pending[2].id, 1, status=DeliveryStatus.FAILURE, next_at=None),
    ]
    await store.record_attempts(records)
    counts = await store.outcome_counts(since=since, bucket_seconds=60)
    bucket = int(time.time() // 60)
    totals = {s: n for s, b, n in counts if b in (bucket - 1, bucket)}
    assert totals == {"success": 2, "failure": 1}
    # Outside the window: nothing.
    assert await store.outcome_counts(since=time.time() + 60, bucket_seconds=60) == []
    assert await store.failing_destinations(since=since, limit=5) == [
        (pending[0].destination_id, 1)
    ]
    assert await store.failing_destinations(since=time.time() + 60, limit=5) == []
    assert await store.in_flight() == 0


async def two_tenants(harness: Harness) -> tuple[Destination, Destination]:
    """A destination of tenant ``default`` and one of tenant ``other``, both taking '*'."""
    mine, theirs = destination(), replace(destination(), tenant_id="other")
    for dest in (mine, theirs):
        await harness.store.create_destination(dest, verification=None)
    await harness.catalog.refresh(force=True)
    return mine, theirs


async def test_the_operator_sees_every_tenants_destinations_and_events(harness: Harness) -> None:
    service = harness.service
    mine, theirs = await two_tenants(harness)
    everyone, more = await service.list_destinations(None, limit=10)
    assert {d.id for d in everyone} == {mine.id, theirs.id}
    assert not more
    only, _ = await service.list_destinations("other", limit=10)
    assert [d.id for d in only] == [theirs.id]
    assert (await service.get(None, theirs.id)).tenant_id == "other"

    event_id = await harness.emit("order.created", {"n": 1})
    event, deliveries = await service.find_event(None, event_id)
    assert event.tenant_id == "default"
    assert [d.destination_id for d in deliveries] == [mine.id]
    event, deliveries = await service.find_event("default", event_id)
    assert [d.event_id for d in deliveries] == [event_id]
    with pytest.raises(NotFound):
        await service.find_event("other", event_id)
    overview = await service.overview()
    assert overview.due + overview.scheduled_retry + overview.held == 1
    assert overview.rejected == 0


async def test_another_tenants_reuse_of_an_event_id_hides_none_of_its_deliveries(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event ids are unique per tenant: tenant ``other`` may publish ``evt_same`` too,
    with more (newer) deliveries than the event page lists. Each tenant's page (the
    console's ``?tenant=``, the portal's scope) lists that tenant's deliveries."""
    monkeypatch.setattr(events_module, "EVENT_DELIVERIES_MAX", 2)
    service = harness.service
    mine = destination()
    theirs = [replace(destination(), tenant_id="other") for _ in range(3)]
    for dest in (mine, *theirs):
        await harness.store.create_destination(dest, verification=None)
    await harness.catalog.refresh(force=True)
    await harness.emit("order.created", id="evt_same")
    await harness.emit("order.created", id="evt_same", tenant_id="other")

    event, deliveries = await service.find_event("default", "evt_same")
    assert event.tenant_id == "default"
    assert [d.destination_id for d in deliveries] == [mine.id]
    event, deliveries = await service.find_event("other", "evt_same")
    assert event.tenant_id == "other"
    assert len(deliveries) == 2  # the page's limit, of this tenant's three
    assert {d.destination_id for d in deliveries} < {t.id for t in theirs}
    assert {d.tenant_id for d in deliveries} == {"other"}


def test_an_events_deliveries_are_found_by_the_event_ids_index(harness: Harness) -> None:
    """The event page's query reads ``herald_deliveries_event`` (a few rows per id),
    never the tenant's deliveries by ``(tenant_id, id)`` nor the table. SQLite is told
    the index (it has no statistics); PostgreSQL chooses it from its statistics, here
    of 20,000 deliveries of one tenant, with the store's custom plans."""
    args = ("default", "evt_same", 200)
    if harness.backend == "sqlite":
        sql = load_queries("sqlite")["event_deliveries"]
        plan = " | ".join(r[3] for r in harness.db.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "herald_deliveries_event" in plan, plan
        assert not re.search(r"SCAN (d|herald_deliveries)\b(?! USING)", plan), plan
        return
    harness.db.execute(
        "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id,"
        " kind, status, max_attempts, created_at, updated_at)"
        " SELECT 'dlv_' || lpad(g::text, 26, '0'), 'default', 'evt_' || g, 'a.b', 'evtd_x',"
        " 'event', 'success', 1, g, g FROM generate_series(1, 20000) g"
    )
    harness.db.execute("ANALYZE herald_deliveries")
    sql = load_queries("postgres")["event_deliveries"]
    for n, value in enumerate(args, start=1):
        sql = sql.replace(f"${n}", f"'{value}'" if isinstance(value, str) else str(value))
    plan = " | ".join(r[0] for r in harness.db.execute("EXPLAIN " + sql))
    assert "herald_deliveries_event" in plan, plan
    assert "herald_deliveries_tenant" not in plan, plan


async def test_a_tenants_overview_counts_its_own_deliveries_only(harness: Harness) -> None:
    """The portal's overview: the same counts, of one tenant's destinations."""
    store, service = harness.store, harness.service
    mine, _ = await two_tenants(harness)
    await harness.emit("order.created", {"n": 1})
    await harness.emit("order.created", {"n": 2})
    await harness.emit("order.created", {"n": 3}, tenant_id="other")
    pending = await store.list_deliveries(
        DeliveryFilter(tenant_id="default"), before_id=None, limit=10
    )
    await store.record_attempts(
        [record(pending[0].id, 1, status=DeliveryStatus.FAILURE, next_at=None)]
    )

    def backlog(ov: Overview) -> int:
        return ov.due + ov.scheduled_retry + ov.held

    everyone = await service.overview()
    default = await service.overview(tenant_id="default")
    other = await service.overview(tenant_id="other")
    assert (backlog(everyone), backlog(default), backlog(other)) == (2, 1, 1)
    assert [f[0] for f in default.failing] == [mine.id]
    assert other.failing == []
    assert {s for s, _, _ in default.last_hour} == {"failure"}
    assert other.last_hour == []
    assert (default.in_flight, other.in_flight) == (0, 0)
    assert default.oldest_due_age is not None
    nobody = await service.overview(tenant_id="nobody")
    assert (backlog(nobody), nobody.last_hour, nobody.failing) == (0, [], [])


@pytest.mark.parametrize(
    ("query", "args"),
    [
        ("console_outcomes", (0.0, 60.0)),
        ("console_failing", (0.0, 5)),
        ("console_in_flight", ()),
        ("tenant_outcomes", (0.0, 60.0, "default")),
        ("tenant_failing", (0.0, 5, "default")),
    ],
)
def test_the_overview_reads_indexes_not_the_deliveries_table(
    harness: Harness, query: str, args: tuple[object, ...]
) -> None:
    """Each overview query is answered from an index: on SQLite a covering index and
    never a walk of the table; on PostgreSQL, with table scans made as costly as they
    get, from the index that serves it."""
    if harness.backend == "sqlite":
        sql = load_queries("sqlite")[query]
        plan = " | ".join(r[3] for r in harness.db.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "COVERING INDEX" in plan, plan
        assert not re.search(r"SCAN herald_deliveries(?! USING)", plan), plan
        return
    sql = load_queries("postgres")[query]
    for n, value in enumerate(args, start=1):
        sql = sql.replace(f"${n}", repr(value) if not isinstance(value, str) else f"'{value}'")
    with harness.db.transaction() as db:
        db.execute("SET LOCAL enable_seqscan = off")
        plan = " | ".join(r[0] for r in db.execute("EXPLAIN " + sql))
    index = "herald_deliveries_leased" if query == "console_in_flight" else "outcomes"
    assert index in plan, plan


@pytest.mark.sqlite_only
def test_a_tenants_deliveries_in_flight_are_counted_from_the_leased_index(
    harness: Harness,
) -> None:
    """Not the tenant's every delivery: the few leased rows, then their tenant. SQLite
    is told so (INDEXED BY); PostgreSQL picks it from its statistics (bench console's
    data set: an index scan of herald_deliveries_leased)."""
    sql = load_queries("sqlite")["tenant_in_flight"]
    plan = " | ".join(r[3] for r in harness.db.execute("EXPLAIN QUERY PLAN " + sql, ("default",)))
    assert "herald_deliveries_leased" in plan, plan
