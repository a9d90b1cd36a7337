"""The hand-over: new deliveries the relay stores already leased to this process's
dispatcher, which starts them at once, without a claim query or a wake-up.

The dispatcher says how many it can take (:class:`Room`); the relay plans that many
leased in its own transaction and hands them over once it has committed. A delivery
of an ordered key that is not its key's head (herald.ordering) is stored waiting,
never leased: the store decides it under the key's lock, as a claim would skip it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from herald.model import DueDelivery, RelayPlan

log = structlog.get_logger("herald.relay")


@dataclass(slots=True)
class Room:
    """What the dispatcher takes from one relay batch as it is written: deliveries
    stored already leased to it and started at once, without a claim query.

    The budget of a claim: the global free slots, and per destination and per tenant
    no more outstanding than one claim can bring it to (``cap``, ``tenant_cap``); the
    rest wait in the table for a claim, by this instance or another."""

    owner: str
    lease_until: float
    free: int
    outstanding: dict[str, int]
    """A copy of the dispatcher's per-destination counts, counted up as we take."""
    cap: int
    """Also where a claim starts to skip a destination (``herald.claims.Claims.enough``)."""
    tenant_load: dict[str, int]
    """A copy of the dispatcher's per-tenant load (``herald.slots.Slots.tenant_load``),
    counted up by each take (by a little more than the load grows: what a destination
    cannot run yet does not add to it; the hand-over stops early, never late)."""
    tenant_cap: int
    """Where a claim starts to skip a tenant (``herald.claims.Claims.tenant_enough``)."""

    def claimable(self, destination_id: str, tenant_id: str) -> bool:
        """Whether a claim would take a delivery of this destination left in the table."""
        return (
            self.outstanding.get(destination_id, 0) < self.cap
            and self.tenant_load.get(tenant_id, 0) < self.tenant_cap
        )

    def take(self, destination_id: str, tenant_id: str) -> bool:
        n = self.outstanding.get(destination_id, 0)
        t = self.tenant_load.get(tenant_id, 0)
        if self.free <= 0 or n >= self.cap or t >= self.tenant_cap:
            return False
        self.outstanding[destination_id] = n + 1
        self.tenant_load[tenant_id] = t + 1
        self.free -= 1
        return True


@dataclass
class Handover:
    """The dispatcher's side: the room it has for a batch, and the door through which
    the deliveries leased to it come in."""

    owner: str
    lease_seconds: float
    cap: int
    tenant_cap: int
    free: Callable[[], int]
    """Deliveries the dispatcher can take on now."""
    outstanding: Mapping[str, int]
    """The dispatcher's live per-destination counts (copied into each room)."""
    tenant_load: Mapping[str, int]
    """The dispatcher's live per-tenant load (copied into each room)."""
    launch: Callable[[list[DueDelivery]], None]
    open: bool = False
    """The dispatcher runs and takes work: what is leased to it once it stops is
    released by the daemon (herald.app)."""

    def room(self) -> Room | None:
        """The relay asks before a batch: how many of its deliveries to lease to us."""
        if not self.open:
            return None
        free = self.free()
        if free <= 0:
            return None
        # A claim takes up to claim_batch for a destination (and a tenant) below its
        # own limit.
        return Room(
            self.owner,
            time.time() + self.lease_seconds,
            free,
            dict(self.outstanding),
            self.cap,
            dict(self.tenant_load),
            self.tenant_cap,
        )

    def adopt(self, due: list[DueDelivery]) -> bool:
        """Start deliveries the relay stored leased to us. False once we stop taking
        work: their leases are the relay's to release."""
        if not self.open:
            return False
        self.launch(due)
        return True

    def receive(self, plan: RelayPlan) -> None:
        """The relay committed ``plan``: start the deliveries it stored leased to us."""
        # An event id is unique per tenant only: the delivery's tenant picks the event.
        events = {(e.tenant_id, e.id): e for e in plan.events}
        planned = {d.id: d for d in plan.deliveries}
        due = []
        for dlv_id in plan.leased:
            d = planned[dlv_id]
            due.append(
                DueDelivery(
                    id=d.id,
                    destination_id=d.destination_id,
                    kind=d.kind,
                    attempt_count=0,
                    max_attempts=d.max_attempts,
                    event=events[d.tenant_id, d.event_id],
                    ordering_key=d.ordering_key,
                    owner=None if d.ordering_key is None else self.owner,
                )
            )
        if not self.adopt(due):
            # The dispatcher is stopping: the daemon releases what is still leased to
            # this instance once both have stopped (herald.app).
            log.info("handover_refused_at_shutdown", count=len(due))


def wakes_claims(plan: RelayPlan, room: Room | None) -> bool:
    """Whether a claim could take a delivery this batch left in the table. Not when each
    is held, or for a destination (or a tenant) this process's dispatcher has enough of
    already: a claim would skip them, and waking it for nothing costs a scan past them."""
    if len(plan.deliveries) <= len(plan.leased):
        return False  # each went over leased
    if room is None:
        return True
    # Planned leased and stored without: its destination was not active at commit, so
    # it is held, and no claim takes it either.
    return any(
        not d.held and d.lease_owner is None and room.claimable(d.destination_id, d.tenant_id)
        for d in plan.deliveries
    )
