"""Flow control over a real store (both backends): the claim spends the rate's tokens
and keeps the circuit's single probe, the recorder opens and closes the circuit with
its operational events, and the service takes and shows the two fields
(docs/flow-control.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from herald.errors import BadRequest, ValidationError
from herald.flow import BreakerSettings
from herald.model import (
    CIRCUIT_CLOSED,
    CIRCUIT_OPENED,
    Attempt,
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Outcome,
)
from herald.views import destination_view
from tests.integration.conftest import Harness

FAR = 2e9


def webhook(**extra: Any) -> dict[str, Any]:
    return {
        "name": "flow",
        "type": "webhook",
        "events": ["flow.*"],
        "webhook": {"url": "http://127.0.0.1:9/hook"},
        **extra,
    }


async def backlog(h: Harness, n: int, **fields: Any) -> str:
    """An active webhook under flow control with ``n`` due event deliveries."""
    dest = await h.add_webhook("http://127.0.0.1:9/hook", events=["flow.*"])
    await h.service.update("default", dest.id, fields)
    await h.catalog.refresh()
    h.produce_many("flow.x", [{"n": i} for i in range(n)])
    assert await h.relay.run_once() >= n
    return dest.id


async def claim(h: Harness, now: float, owner: str = "w") -> list[DueDelivery]:
    return await h.store.claim_due(now=now, limit=1000, owner=owner, lease_until=now + 60)


async def test_the_claim_takes_one_seconds_worth_then_one_token_at_a_time(harness: Harness) -> None:
    h = harness
    dest_id = await backlog(h, 30, rate_limit_per_second=10)
    now = time.time()
    gates: dict[str, float] = {}
    first = await h.store.claim_due(
        now=now, limit=1000, owner="a", lease_until=now + 60, gates=gates
    )
    assert len(first) == 10  # the burst: one second's worth
    assert gates[dest_id] > now
    # Another instance, at the same moment: the bucket is shared, and empty.
    assert await claim(h, now, owner="b") == []
    # What was not taken was never leased: due as it was.
    assert h.scalar("SELECT COUNT(*) FROM herald_deliveries WHERE lease_owner IS NOT NULL") == 10
    assert len(await claim(h, now + 0.1 + 1e-3, owner="b")) == 1
    assert len(await claim(h, now + 0.6 + 1e-3, owner="a")) == 5


async def test_the_lanes_come_first_and_a_shut_gate_keeps_its_backlog_out_of_the_claim(
    harness: Harness,
) -> None:
    """A destination that comes under flow control takes its pending deliveries into its
    lane; a claim serves the lanes first (a common backlog must not starve a rate), then
    the common lane, and gives a gated backlog nothing."""
    h = harness
    paced = await h.add_webhook("http://127.0.0.1:9/hook", events=["flow.*"])
    free = await h.add_webhook("http://127.0.0.1:9/free", events=["flow.*"])
    await h.catalog.refresh()
    h.produce_many("flow.x", [{"n": i} for i in range(6)])
    assert await h.relay.run_once() >= 6
    lane = "SELECT COUNT(*) FROM herald_deliveries WHERE destination_id = ? AND flow = 1"
    assert h.scalar(lane, (paced.id,)) == 0
    await h.service.update("default", paced.id, {"rate_limit_per_second": 2})
    assert h.scalar(lane, (paced.id,)) == 6
    assert h.scalar(lane, (free.id,)) == 0
    now = time.time()
    gates: dict[str, float] = {}
    # A batch of 3: the two tokens of the paced one first, then the oldest free one.
    first = await h.store.claim_due(now=now, limit=3, owner="a", lease_until=now + 60, gates=gates)
    assert sorted(d.destination_id == paced.id for d in first) == [False, True, True]
    assert [d.flow_lane for d in first if d.destination_id == paced.id] == [True, True]
    assert gates[paced.id] > now
    # Its gate shut: the rest of the free backlog, and none of the paced one.
    rest = await claim(h, now)
    assert [d.destination_id for d in rest] == [free.id] * 5
    assert await claim(h, now) == []
    assert len(await claim(h, gates[paced.id] + 1e-3)) == 1


async def test_a_finished_delivery_requeued_goes_in_the_lane_its_destination_has_now(
    harness: Harness,
) -> None:
    h = harness
    dest = await h.add_webhook("http://127.0.0.1:9/hook", events=["flow.*"])
    await h.catalog.refresh()
    h.produce_many("flow.x", [{"n": 1}])
    assert await h.relay.run_once() >= 1
    with h.sql() as db:
        db.execute(
            "UPDATE herald_deliveries SET status = 'failure' WHERE destination_id = ?", (dest.id,)
        )
    (dlv,) = h.rows("SELECT id, flow FROM herald_deliveries WHERE destination_id = ?", (dest.id,))
    assert dlv[1] == 0
    await h.service.update("default", dest.id, {"circuit_breaker": True})
    assert await h.store.requeue([dlv[0]], now=time.time()) == 1
    assert h.rows("SELECT status, flow FROM herald_deliveries WHERE id = ?", (dlv[0],)) == [
        ("pending", 1)
    ]


async def test_a_verification_ping_passes_the_rate(harness: Harness) -> None:
    h = harness
    created = await h.service.create("default", webhook(rate_limit_per_second=1))
    with h.sql() as db:  # the bucket empty for a long while
        db.execute("UPDATE herald_flow SET tat = ?, gate_until = ?", (FAR, FAR))
    pings = [d for d in await claim(h, time.time()) if d.destination_id == created.id]
    assert [p.kind for p in pings] == [DeliveryKind.VERIFICATION]


def failed(item: DueDelivery, now: float, ok: bool = False) -> AttemptRecord:
    outcome = Outcome.SUCCESS if ok else Outcome.FAILURE_RETRYABLE
    attempt = Attempt(f"att_{item.id}_{now}", item.id, 1, now, 1.0, outcome)
    status = DeliveryStatus.SUCCESS if ok else DeliveryStatus.PENDING
    return AttemptRecord(attempt, status, None if ok else now, item=item)


async def test_the_circuit_opens_holds_the_backlog_and_lets_one_probe_through(
    harness: Harness,
) -> None:
    h = harness
    h.store.breaker = BreakerSettings(failures=3, cooldown=5.0, max_cooldown=20.0)
    dest_id = await backlog(h, 10, circuit_breaker=True)
    now = time.time()
    taken = await claim(h, now)
    assert len(taken) == 10
    recorded = await h.store.record_attempts([failed(d, now) for d in taken[:3]])
    # The circuit opened on the recording's own clock, by now at the latest (on a loaded
    # machine a few tenths after ``now``).
    opened = time.time()
    assert [s.type for s in recorded.signals if s.type == CIRCUIT_OPENED] == [CIRCUIT_OPENED]
    view = destination_view(await h.service.get("default", dest_id), h.registry)
    assert view["circuit"]["state"] == "open"
    assert view["circuit"]["next_probe_at"] is not None
    # The others, in flight when it opened, end and are recorded: no second event.
    more = await h.store.record_attempts([failed(d, now) for d in taken[3:]])
    assert not [s for s in more.signals if s.type == CIRCUIT_OPENED]
    # Every recording says how it left the circuit: another instance's dispatcher
    # learns there that it opened (and since when).
    assert more.circuits[dest_id] == recorded.circuits[dest_id]
    assert recorded.circuits[dest_id] is not None
    assert await claim(h, now + 1) == []  # open: nothing is claimed
    (probe,) = await claim(h, opened + 5.1)  # the cooldown is over: exactly one
    assert await claim(h, opened + 5.2) == []  # it is out: nothing else
    view = destination_view(await h.service.get("default", dest_id), h.registry)
    assert view["circuit"]["state"] == "half_open"
    closed = await h.store.record_attempts([failed(probe, opened + 5.3, ok=True)])
    (event,) = [s for s in closed.signals if s.type == CIRCUIT_CLOSED]
    assert event.data["destination_id"] == dest_id
    assert event.data["consecutive_failures"] == 10
    assert closed.circuits == {dest_id: None}
    assert len(await claim(h, now + 5.4)) == 9  # the backlog flows


async def test_a_deleted_destination_leaves_no_flow_row_for_the_claims_to_probe(
    harness: Harness,
) -> None:
    """Deleting a destination ends its deliveries and drops its flow row, and an attempt
    in flight at the deletion, recorded after it, does not bring the row back."""
    h = harness
    dest_id = await backlog(h, 6, rate_limit_per_second=100, circuit_breaker=True)
    kept = await backlog(h, 1, rate_limit_per_second=100)
    rows = "SELECT COUNT(*) FROM herald_flow WHERE destination_id = ?"
    now = time.time()
    in_flight = [d for d in await claim(h, now) if d.destination_id == dest_id]
    assert in_flight
    assert h.scalar(rows, (dest_id,)) == 1
    await h.service.delete("default", dest_id)
    assert h.scalar(rows, (dest_id,)) == 0
    assert h.scalar(rows, (kept,)) == 1
    await h.store.record_attempts([failed(d, now) for d in in_flight])
    assert h.scalar(rows, (dest_id,)) == 0
    statuses = "SELECT DISTINCT status FROM herald_deliveries WHERE destination_id = ?"
    assert h.rows(statuses, (dest_id,)) == [("failure",)]


async def test_the_service_takes_checks_and_shows_the_fields(harness: Harness) -> None:
    h = harness
    dest = await h.service.create("default", webhook(rate_limit_per_second=2.5))
    view = destination_view(await h.service.get("default", dest.id), h.registry)
    assert view["rate_limit_per_second"] == 2.5
    assert view["circuit_breaker"] is False
    assert view["circuit"] is None
    await h.service.update("default", dest.id, {"circuit_breaker": True})
    view = destination_view(await h.service.get("default", dest.id), h.registry)
    assert view["rate_limit_per_second"] == 2.5  # PATCH leaves what it does not name
    assert view["circuit"] == {"state": "closed", "opened_at": None, "next_probe_at": None}
    await h.service.update("default", dest.id, {"rate_limit_per_second": None})
    assert (await h.service.get("default", dest.id)).rate_limit_per_second is None
    with pytest.raises(ValidationError) as bad:
        await h.service.create("default", webhook(rate_limit_per_second=0))
    assert bad.value.field == "rate_limit_per_second"
    with pytest.raises(BadRequest):
        await h.service.create("default", webhook(rate_limit_per_second="10"))
    with pytest.raises(BadRequest):
        await h.service.update("default", dest.id, {"circuit_breaker": "yes"})
