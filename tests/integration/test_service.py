"""Operations over a real store (both backends): validation, state transitions,
test pings, replay."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import web

from herald.attempt import attempt
from herald.catalog import Catalog
from herald.errors import BadRequest, Conflict, HeraldError, NotFound, ValidationError
from herald.model import (
    DeliveryFilter,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DestinationStatus,
    Outcome,
)
from tests.integration.conftest import (
    SECRET,
    Harness,
    HarnessFactory,
    ReceiverFactory,
    eventually,
    running,
    status,
)
from tests.support.receiver import Received


def body(url: str = "http://127.0.0.1:9/hook", **extra: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"name": "orders", "type": "webhook", "events": ["order.*"]}
    b["webhook"] = {"url": url, **extra.pop("webhook", {})}
    b.update(extra)
    return b


async def activate(h: Harness, dest_id: str, *, tenant: str = "default") -> Destination:
    """Let a real dispatcher run the verification ping until the destination is active."""

    async def active() -> bool:
        dest = await h.store.get_destination(None, dest_id)
        return dest is not None and dest.status is DestinationStatus.ACTIVE

    async with running(h.dispatcher()):
        await eventually(active, timeout=10, what="verification")
    await h.catalog.refresh()
    return await h.service.get(tenant, dest_id)


def stored_counts(h: Harness) -> tuple[int, int, int]:
    return (
        h.scalar("SELECT COUNT(*) FROM herald_destinations"),
        h.scalar("SELECT COUNT(*) FROM herald_deliveries"),
        h.scalar("SELECT COUNT(*) FROM herald_events"),
    )


# --- create -------------------------------------------------------------------------
async def test_create_is_pending_with_a_verification_delivery(harness: Harness) -> None:
    h = harness
    t0 = time.time()
    dest = await h.service.create(
        "acme",
        body(events=["order.*", "invoice.paid", "order.*"], webhook={"secret": SECRET}),
    )
    assert dest.id.startswith("evtd_")
    assert dest.status is DestinationStatus.PENDING_VERIFICATION
    assert dest.type == "webhook"
    assert dest.events == ("order.*", "invoice.paid")
    assert dest.config == {"url": "http://127.0.0.1:9/hook"}
    assert dest.secrets == {"secret": SECRET}
    assert await h.service.get("acme", dest.id) == dest
    with pytest.raises(NotFound):
        await h.service.get("default", dest.id)  # another tenant's
    [ping] = await h.deliveries(destination_id=dest.id)
    assert ping.kind is DeliveryKind.VERIFICATION
    assert ping.event_type == "destination.verification"
    assert ping.tenant_id == "acme"
    assert ping.status is DeliveryStatus.PENDING
    assert not ping.held
    assert ping.max_attempts == 0  # its first round; the budget is the attempting daemon's
    assert ping.next_attempt_at is not None
    assert t0 <= ping.next_attempt_at <= time.time()
    event = await h.store.get_event("acme", ping.event_id)
    assert event is not None
    assert event.data == f'{{"destination_id":"{dest.id}"}}'.encode()


@pytest.mark.parametrize(
    ("payload", "error", "field"),
    [
        (
            {"name": "x", "type": "webhook", "events": ["*"], "webhook": {}},
            ValidationError,
            "webhook.url",
        ),
        (body(webhook={"secret": "not-a-whsec"}), ValidationError, "webhook.secret"),
        (body(webhook={"secret": "whsec_c2hvcnQ="}), ValidationError, "webhook.secret"),
        (
            body(webhook={"custom_headers": '["X-A", "b"]'}),
            ValidationError,
            "webhook.custom_headers",
        ),
        (body(webhook={"custom_headers": "{not json"}), ValidationError, "webhook.custom_headers"),
        (
            body(webhook={"custom_headers": '{"webhook-id": "x"}'}),
            ValidationError,
            "webhook.custom_headers",
        ),
        (body(webhook={"colour": "red"}), ValidationError, "webhook.colour"),
        (body("ftp://127.0.0.1/x"), ValidationError, "webhook.url"),
        (body(type="carrier_pigeon"), ValidationError, "type"),
        (
            {"name": "x", "events": ["*"], "webhook": {"url": "http://127.0.0.1:9/"}},
            ValidationError,
            "type",
        ),
        (body(colour="red"), BadRequest, "colour"),
        (
            {"type": "webhook", "events": ["*"], "webhook": {"url": "http://127.0.0.1:9/"}},
            ValidationError,
            "name",
        ),
        (body(events=[]), ValidationError, "events"),
        (body(events=["order.*", "Bad Pattern"]), ValidationError, "events[1]"),
        (body(events="order.created"), BadRequest, "events"),
        (body(webhook={"url": 42}), BadRequest, "webhook.url"),
        (
            {"name": "x", "type": "webhook", "events": ["*"], "webhook": "http://x"},
            BadRequest,
            "webhook",
        ),
        ({"name": "x", "type": "webhook", "events": ["*"]}, ValidationError, "webhook"),
    ],
)
async def test_create_rejects_bad_bodies_with_the_field(
    harness: Harness, payload: dict[str, Any], error: type[HeraldError], field: str
) -> None:
    h = harness
    before = stored_counts(h)
    with pytest.raises(error) as info:
        await h.service.create("default", payload)
    assert type(info.value) is error
    assert info.value.field == field
    assert info.value.message
    assert stored_counts(h) == before


async def test_create_refuses_private_urls_unless_allowed(harness_factory: HarnessFactory) -> None:
    h = await harness_factory(security={"allow_private_networks": False})
    for url in ("http://127.0.0.1:9/hook", "http://localhost:9/hook", "http://10.1.2.3/x"):
        with pytest.raises(ValidationError) as info:
            await h.service.create("default", body(url))
        assert info.value.field == "webhook.url", url
        assert "egress denied" in info.value.message
    assert stored_counts(h) == (0, 0, 0)


# --- update ---------------------------------------------------------------------------
async def test_update_url_goes_back_to_verification(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers()
    dest = await h.service.create("default", body(rx.url, webhook={"secret": SECRET}))
    dest = await activate(h, dest.id)
    assert dest.status is DestinationStatus.ACTIVE
    [first_ping] = await h.deliveries(destination_id=dest.id)
    assert first_ping.status is DeliveryStatus.SUCCESS

    # A name or secret change keeps it active: the target is the same.
    renamed = await h.service.update(
        "default", dest.id, {"name": "renamed", "webhook": {"secret": SECRET}}
    )
    assert (renamed.name, renamed.status) == ("renamed", DestinationStatus.ACTIVE)
    assert len(await h.deliveries(destination_id=dest.id)) == 1

    event_id = await h.emit("order.created")
    [event_dlv] = [d for d in await h.deliveries(destination_id=dest.id) if d.event_id == event_id]
    assert not event_dlv.held

    other = await receivers(status(500))
    moved = await h.service.update("default", dest.id, {"webhook": {"url": other.url}})
    assert moved.status is DestinationStatus.PENDING_VERIFICATION
    assert moved.config["url"] == other.url
    # A new target gets a fresh secret, never the old one (tests/integration/test_repoint.py).
    assert moved.secrets["secret"] not in (SECRET, None)
    assert moved.name == "renamed"
    pings = await h.deliveries(destination_id=dest.id, event_types=("destination.verification",))
    assert len(pings) == 2
    new_ping = pings[0]
    assert (new_ping.status, new_ping.kind, new_ping.held) == (
        DeliveryStatus.PENDING,
        DeliveryKind.VERIFICATION,
        False,
    )
    assert (await h.delivery(event_dlv.id)).held  # events wait for the new URL

    with pytest.raises(Conflict) as info:
        await h.service.update("default", dest.id, {"status": "active"})
    assert info.value.field == "status"
    assert (await h.service.get("default", dest.id)).status is (
        DestinationStatus.PENDING_VERIFICATION
    )
    with pytest.raises(ValidationError) as bad:
        await h.service.update("default", dest.id, {"status": "paused"})
    assert bad.value.field == "status"
    with pytest.raises(ValidationError) as immutable:
        await h.service.update("default", dest.id, {"type": "aws_sqs"})
    assert immutable.value.field == "type"
    with pytest.raises(BadRequest) as unknown:
        await h.service.update("default", dest.id, {"colour": "red"})
    assert unknown.value.field == "colour"


async def test_a_ping_for_a_new_target_never_goes_to_the_old_one_from_a_stale_view(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    """A worker's view of the destinations lags behind a URL change until it reloads:
    the new target's ping, attempted from it, must still reach the new target — sent
    to the old, live one it would activate a destination nobody verified."""
    h = harness
    old, new = await receivers(), await receivers(status(500))
    dest = await activate(h, (await h.service.create("default", body(old.url))).id)
    stale = Catalog(h.store, h.registry)
    await stale.refresh()
    await h.service.update("default", dest.id, {"webhook": {"url": new.url}})
    now = time.time()
    claimed = await h.store.claim_due(now=now, limit=10, owner="t", lease_until=now + 60)
    [ping] = [d for d in claimed if d.kind is DeliveryKind.VERIFICATION]
    pings_before = len(old.received)

    record, _ = await attempt(stale, h.policy, ping)

    assert (len(old.received), len(new.received)) == (pings_before, 1)
    assert record.activates_destination is None
    assert record.attempt.response_status == 500


async def test_status_toggles_hold_and_release_deliveries(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers()
    dest = await activate(h, (await h.service.create("default", body(rx.url))).id)
    off = await h.service.update("default", dest.id, {"status": "inactive"})
    assert off.status is DestinationStatus.INACTIVE
    event_id = await h.emit("order.created")
    [dlv] = [d for d in await h.deliveries() if d.event_id == event_id]
    assert dlv.held
    on = await h.service.update("default", dest.id, {"status": "active"})
    assert on.status is DestinationStatus.ACTIVE
    got = await h.delivery(dlv.id)
    assert not got.held
    assert got.attempt_count == 0


async def test_a_new_url_cannot_be_activated_without_verification(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    good = await receivers()
    dest = await activate(h, (await h.service.create("default", body(good.url))).id)
    unverified = await receivers(status(500))
    # A new URL means verification; pausing it in the same breath is refused, so
    # there is no unverified inactive state to toggle back to active.
    with pytest.raises(Conflict):
        await h.service.update(
            "default", dest.id, {"webhook": {"url": unverified.url}, "status": "inactive"}
        )
    await h.service.update("default", dest.id, {"webhook": {"url": unverified.url}})
    with pytest.raises(Conflict):
        await h.service.update("default", dest.id, {"status": "inactive"})
    with pytest.raises(Conflict):
        await h.service.update("default", dest.id, {"status": "active"})
    after = await h.service.get("default", dest.id)
    assert after.status is DestinationStatus.PENDING_VERIFICATION


async def test_a_never_verified_destination_cannot_be_activated_via_inactive(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers(status(500))
    dest = await h.service.create("default", body(rx.url))
    for wanted in ("inactive", "active"):
        with pytest.raises(Conflict) as info:
            await h.service.update("default", dest.id, {"status": wanted})
        assert info.value.code == "destination_not_verified"
    after = await h.service.get("default", dest.id)
    assert after.status is DestinationStatus.PENDING_VERIFICATION


async def test_operations_are_scoped_to_the_tenant(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers()
    dest = await activate(h, (await h.service.create("acme", body(rx.url))).id, tenant="acme")
    await h.emit("order.created", tenant_id="acme")
    [dlv] = await h.deliveries(tenant_id="acme", event_types=("order.created",))
    for call in (
        lambda: h.service.get("globex", dest.id),
        lambda: h.service.update("globex", dest.id, {"name": "stolen"}),
        lambda: h.service.delete("globex", dest.id),
        lambda: h.service.test("globex", dest.id),
        lambda: h.service.rotate_secret("globex", dest.id),
        lambda: h.service.verify("globex", dest.id),
        lambda: h.service.get_delivery("globex", dlv.id),
        lambda: h.service.retry("globex", dlv.id),
    ):
        with pytest.raises(NotFound):
            await call()
    listed, more = await h.service.list_destinations("globex")
    assert (listed, more) == ([], False)
    replay = await h.service.replays.run(DeliveryFilter(tenant_id="globex"))
    assert (replay.matched, replay.requeued) == (0, 0)
    same = await h.service.get("acme", dest.id)
    assert (same.name, same.status, same.deleted) == ("orders", DestinationStatus.ACTIVE, False)
    assert rx.events("test.ping") == []


# --- delete -------------------------------------------------------------------------------
async def test_delete_fails_pending_deliveries_and_keeps_the_record(harness: Harness) -> None:
    h = harness
    dest = await h.service.create("default", body())
    await h.emit("order.created")
    await h.emit("order.paid")
    pending = await h.deliveries(destination_id=dest.id)
    assert len(pending) == 3  # the verification ping and two held events
    assert {d.status for d in pending} == {DeliveryStatus.PENDING}
    deleted = await h.service.delete("default", dest.id)
    assert deleted.deleted_at is not None
    for d in await h.deliveries(destination_id=dest.id):
        assert d.status is DeliveryStatus.FAILURE
        assert d.next_attempt_at is None
    with pytest.raises(NotFound):
        await h.service.get("default", dest.id)
    kept = await h.service.get("default", dest.id, deleted=True)
    assert kept.deleted
    assert kept.id == dest.id
    with pytest.raises(NotFound):
        await h.service.delete("default", dest.id)
    with pytest.raises(NotFound):
        await h.service.update("default", dest.id, {"name": "zombie"})
    listed, _ = await h.service.list_destinations("default")
    assert dest.id not in [d.id for d in listed]
    # Events after the delete reach nobody.
    event_id = await h.emit("order.created")
    assert [d for d in await h.deliveries() if d.event_id == event_id] == []
    assert await h.store.claim_due(now=time.time(), limit=10, owner="w", lease_until=2e9) == []


async def test_each_change_signals_the_daemon_once(harness: Harness) -> None:
    """Issue 29: the service is the one that tells the daemon of a change (the faces
    no longer wake it again), once per change, and a read tells it nothing."""
    h = harness
    told: list[str] = []
    h.service.when_changed = lambda: told.append("changed")
    dest = await h.service.create("default", body())
    assert told == ["changed"]
    await h.service.update("default", dest.id, {"name": "renamed"})
    await h.service.verify("default", dest.id)
    assert len(told) == 3
    await h.service.get("default", dest.id)
    await h.service.list_destinations("default")
    assert len(told) == 3
    await h.service.publish("default", "order.created", {"n": 1})
    assert len(told) == 4
    await h.service.delete("default", dest.id)
    assert len(told) == 5


# --- test pings ---------------------------------------------------------------------------
async def test_test_ping_needs_an_active_destination(
    harness: Harness, receivers: ReceiverFactory
) -> None:
    h = harness
    rx = await receivers()
    dest = await h.service.create("default", body(rx.url, webhook={"secret": SECRET}))
    with pytest.raises(Conflict):
        await h.service.test("default", dest.id)
    assert rx.received == []
    assert len(await h.deliveries(destination_id=dest.id)) == 1

    dest = await activate(h, dest.id)
    dlv = await h.service.test("default", dest.id)
    assert dlv.kind is DeliveryKind.TEST
    assert dlv.event_type == "test.ping"
    assert dlv.status is DeliveryStatus.SUCCESS
    assert dlv.attempt_count == 1
    assert dlv.next_attempt_at is None
    [attempt] = dlv.attempts
    assert attempt.outcome is Outcome.SUCCESS
    [ping] = rx.events("test.ping")
    assert ping.envelope["data"] == {"ok": True}
    assert ping.verified
    assert ping.headers["webhook-id"] == dlv.event_id

    await h.service.update("default", dest.id, {"status": "inactive"})
    with pytest.raises(Conflict):
        await h.service.test("default", dest.id)


async def test_a_failed_test_ping_is_not_retried(
    harness_factory: HarnessFactory, receivers: ReceiverFactory
) -> None:
    h = await harness_factory(delivery={"backoff_base_seconds": 0.01})

    def verify_ok_then_fail(item: Received) -> web.StreamResponse:
        code = 204 if item.type == "destination.verification" else 503
        return web.Response(status=code)

    rx = await receivers(verify_ok_then_fail)
    dest = await activate(h, (await h.service.create("default", body(rx.url))).id)
    dlv = await h.service.test("default", dest.id)
    assert dlv.status is DeliveryStatus.FAILURE
    assert dlv.attempt_count == 1
    assert dlv.next_attempt_at is None
    [attempt] = dlv.attempts
    assert (attempt.outcome, attempt.response_status) == (Outcome.FAILURE_RETRYABLE, 503)
    # Workers never pick it up again, and it cannot be retried or replayed.
    async with running(h.dispatcher()):
        await asyncio.sleep(0.3)
    assert len(rx.events("test.ping")) == 1
    with pytest.raises(Conflict):
        await h.service.retry("default", dlv.id)


# --- secrets ----------------------------------------------------------------------------------
async def test_rotate_secret(harness: Harness) -> None:
    h = harness
    dest = await h.service.create("default", body(webhook={"secret": SECRET}))
    updated, secret = await h.service.rotate_secret("default", dest.id)
    assert secret.startswith("whsec_")
    assert secret != SECRET
    assert updated.secrets["secret"] == secret
    assert updated.secrets["_previous_secret"] == SECRET
    until = updated.config["_previous_secret_until"]
    assert 24 * 3600 - 5 <= until - time.time() <= 24 * 3600
    stored = await h.store.get_destination("default", dest.id)
    assert stored is not None
    assert stored.secrets == updated.secrets
    # The status is untouched: a secret is not a new target.
    assert stored.status is DestinationStatus.PENDING_VERIFICATION
    chosen = "whsec_" + "Q" * 44
    _, given = await h.service.rotate_secret("default", dest.id, chosen)
    assert given == chosen
    with pytest.raises(ValidationError) as info:
        await h.service.rotate_secret("default", dest.id, "plain-text")
    assert info.value.field == "secret"


async def test_a_refresh_that_read_before_a_rotation_never_wins_over_one_after(
    harness: Harness,
) -> None:
    """Two catalog refreshes overlap: the one that read the destinations before a secret
    rotation must not finish last and put the old secret back (a test ping right after
    the rotation was once signed with the new secret only, then with the old one)."""
    h = harness
    dest = await h.service.create("default", body(webhook={"secret": SECRET}))
    await h.catalog.refresh(force=True)
    first_read = asyncio.Event()
    release = asyncio.Event()
    real = h.store.all_destinations
    calls = 0

    async def slow_first_read() -> list[Destination]:
        nonlocal calls
        calls += 1
        got = await real()
        if calls == 1:  # the stale read: it waits until the rotation has been refreshed
            first_read.set()
            await release.wait()
        return got

    h.store.all_destinations = slow_first_read  # type: ignore[method-assign]
    try:
        stale = asyncio.create_task(h.catalog.refresh(force=True))
        await first_read.wait()
        _, secret = await h.service.rotate_secret("default", dest.id)
        fresh = asyncio.create_task(h.catalog.refresh())
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(stale, fresh)
    finally:
        del h.store.all_destinations
    entry = h.catalog.get(dest.id)
    assert entry is not None
    assert entry.dest.secrets["secret"] == secret


# --- replay -------------------------------------------------------------------------------------
async def test_replay_dry_run_changes_nothing_and_replay_requeues_exactly_the_matches(
    harness_factory: HarnessFactory, receivers: ReceiverFactory
) -> None:
    h = await harness_factory(delivery={"max_retries": 0, "backoff_base_seconds": 0.01})
    failing = {"on": True}

    def flaky(item: Received) -> web.StreamResponse:
        bad = failing["on"] and item.type.startswith("order.")
        return web.Response(status=500 if bad else 204)

    rx_a = await receivers(flaky)
    rx_b = await receivers()
    a = await h.add_webhook(rx_a.url)
    b = await h.add_webhook(rx_b.url)
    for type_ in ("order.created", "order.created", "order.paid", "invoice.paid"):
        await h.emit(type_)
    assert len(await h.deliveries()) == 8

    async def settled() -> bool:
        return await h.deliveries(status=DeliveryStatus.PENDING) == []

    async with running(h.dispatcher()):
        await eventually(settled, timeout=10, what="all deliveries finished")
    failed = await h.deliveries(status=DeliveryStatus.FAILURE)
    assert sorted((d.destination_id, d.event_type) for d in failed) == [
        (a.id, "order.created"),
        (a.id, "order.created"),
        (a.id, "order.paid"),
    ]
    wanted = sorted(d.id for d in failed if d.event_type == "order.created")
    flt = DeliveryFilter(
        tenant_id="default", status=DeliveryStatus.FAILURE, event_types=("order.created",)
    )

    snapshot = h.rows("SELECT * FROM herald_deliveries ORDER BY id")
    dry = await h.service.replays.run(flt, dry_run=True)
    assert (dry.matched, dry.requeued, dry.dry_run) == (2, 0, True)
    assert sorted(d.id for d in dry.sample) == wanted
    assert h.rows("SELECT * FROM herald_deliveries ORDER BY id") == snapshot

    progress: list[tuple[int, int]] = []
    t0 = time.time()
    result = await h.service.replays.run(
        flt, progress=lambda done, total: progress.append((done, total))
    )
    assert (result.matched, result.requeued, result.dry_run) == (2, 2, False)
    assert progress[-1] == (2, 2)
    after = {row[0]: row for row in h.rows("SELECT * FROM herald_deliveries ORDER BY id")}
    for row in snapshot:
        if row[0] not in wanted:
            assert after[row[0]] == row  # everything else is exactly as it was
    for dlv_id in wanted:
        d = await h.delivery(dlv_id)
        assert d.status is DeliveryStatus.PENDING
        assert (d.attempt_count, d.max_attempts) == (1, 1)  # a new round from attempt 1
        assert d.next_attempt_at is not None
        assert t0 <= d.next_attempt_at <= time.time()

    # The receiver recovers; the replayed deliveries succeed on their second attempt.
    failing["on"] = False
    async with running(h.dispatcher()):
        await eventually(settled, timeout=10, what="replayed deliveries finished")
    for dlv_id in wanted:
        d = await h.delivery(dlv_id)
        assert d.status is DeliveryStatus.SUCCESS
        assert [a.outcome for a in d.attempts] == [Outcome.FAILURE_RETRYABLE, Outcome.SUCCESS]
    still_failed = await h.deliveries(status=DeliveryStatus.FAILURE)
    assert [(d.destination_id, d.event_type) for d in still_failed] == [(a.id, "order.paid")]
    for d in await h.deliveries(destination_id=b.id):
        assert (d.status, d.attempt_count) == (DeliveryStatus.SUCCESS, 1)
    assert len(rx_b.received) == 4


async def test_an_event_id_conflicts_only_within_its_tenant(harness: Harness) -> None:
    """POST /v2/events's conflict check: another tenant's event of the same id is
    another event (no 409, no oracle); the same tenant's is a 409, whether it still
    waits in the outbox or was relayed."""
    h = harness
    for t in ("acme", "globex"):
        published = await h.service.publish(t, "order.created", {"t": t}, event_id="evt_same")
        assert (published.id, published.tenant_id) == ("evt_same", t)
    for relayed in (False, True):
        if relayed:
            assert await h.relay.run_once() == 2
            assert h.scalar("SELECT COUNT(*) FROM herald_events") == 2
        with pytest.raises(Conflict) as exc:
            await h.service.publish("acme", "order.created", {"t": "x"}, event_id="evt_same")
        assert exc.value.code == "event_exists"
        for t in ("acme", "globex"):
            found = await h.service.get_event(t, "evt_same")
            assert (found.tenant_id, json.loads(found.data)) == (t, {"t": t})
        with pytest.raises(NotFound):
            await h.service.get_event("initech", "evt_same")
    # A third tenant takes the id after the others were relayed.
    await h.service.publish("initech", "order.created", {"t": "initech"}, event_id="evt_same")
    assert await h.relay.run_once() == 1
    assert h.scalar("SELECT COUNT(*) FROM herald_outbox_rejected") == 0
    found = await h.service.get_event("initech", "evt_same")
    assert json.loads(found.data) == {"t": "initech"}


async def test_a_published_event_is_found_while_the_relay_moves_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-your-write: an event read back right after it was published is found even
    when the relay moves it from the outbox into the events between the service's two
    lookups (the relay commits just before the outbox is read)."""
    h = harness
    event = await h.service.publish("acme", "order.created", {"n": 1})
    assert await h.store.get_event("acme", event.id) is None  # still in the outbox
    outbox_lookup = h.store.get_outbox_event

    async def relay_first(tenant_id: str, event_id: str) -> Any:
        assert await h.relay.run_once() == 1
        return await outbox_lookup(tenant_id, event_id)

    monkeypatch.setattr(h.store, "get_outbox_event", relay_first)
    found = await h.service.get_event("acme", event.id)
    assert (found.id, found.type, json.loads(found.data)) == (event.id, "order.created", {"n": 1})
    monkeypatch.undo()
    with pytest.raises(NotFound):
        await h.service.get_event("other", event.id)
