"""The dispatcher's slots: which of the deliveries it holds may start now, and which wait.

Pure and synchronous (no I/O, no clock, no event loop): every delivery the dispatcher
claimed or was handed over is counted here from then until its attempt ends, or until
it is dropped from a queue at shutdown. A delivery starts within three limits, taken
in this order:

1. its destination's (``max_per_destination``): beyond it, the delivery waits in its
   destination's queue;
2. its tenant's (``max_per_tenant``): holding a slot of its destination, it waits in
   its tenant's queue;
3. the global one (``max_concurrency``, and a bound on finished attempts still waiting
   to be written): holding both, it waits in the ready queue.

A slot that frees passes to the next delivery waiting for it, so each queue moves in
claim order with no task per waiting delivery. A waiting delivery waits only for slots
held by deliveries further along, and the running ones always end: nothing waits in a
circle.

The claim budget (:meth:`Slots.free`) counts only what can start soon. A delivery
beyond its destination's limit, or beyond its tenant's (counting only what its
destinations can run), is *parked*: it waits behind its own and takes none of the
budget, so one slow destination's or one tenant's backlog cannot crowd the others out
of the claims.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from herald.model import DueDelivery

CLAIM_BUDGET_FACTOR = 2
"""Deliveries a dispatcher holds beyond the parked ones, in multiples of
``max_concurrency``: the next ones are in memory when a slot frees."""


class Slots:
    """The global, per-destination and per-tenant slots of one dispatcher, and the
    deliveries waiting for them. ``begin`` is called with each delivery that takes a
    global slot (its attempt must end in :meth:`release`)."""

    def __init__(
        self,
        *,
        max_concurrency: int,
        max_per_destination: int,
        max_per_tenant: int,
        destination_enough: int,
        tenant_enough: int,
        begin: Callable[[DueDelivery], None],
        unwritten: Callable[[], int] = lambda: 0,
        max_unwritten: int | None = None,
    ) -> None:
        self._max_concurrency = max_concurrency
        self._per_destination = max_per_destination
        self._per_tenant = max_per_tenant
        self._destination_enough = destination_enough
        self._tenant_enough = tenant_enough
        """Where a claim starts to skip a destination or a tenant (``herald.claims``):
        a release that brings one below it makes room a claim can use."""
        self._begin = begin
        self._unwritten = unwritten
        self._max_unwritten = max_unwritten if max_unwritten is not None else 1 << 62
        self._budget = CLAIM_BUDGET_FACTOR * max_concurrency
        self._ours: set[str] = set()
        self.total = 0
        """Deliveries held: running or waiting."""
        self.running = 0
        self.outstanding: Counter[str] = Counter()
        """Deliveries held per destination (running or waiting); a live view."""
        self.tenant_load: dict[str, int] = {}
        """Per tenant, its deliveries held that are not parked behind their destination's
        limit: over its destinations, ``min(outstanding, max_per_destination)`` summed;
        a live view. Claims skip a tenant by this count, so that one slow destination's
        backlog does not stop its tenant's other destinations."""
        self._used = 0
        """Of :attr:`total`, those not parked: per tenant ``min(tenant_load,
        max_per_tenant)``, summed."""
        self._destination_slots: dict[str, int] = {}
        self._tenant_slots: dict[str, int] = {}
        self._destination_waiting: dict[str, deque[DueDelivery]] = {}
        """Waiting for a slot of their destination."""
        self._tenant_waiting: dict[str, deque[DueDelivery]] = {}
        """Holding their destination's slot, waiting for one of their tenant."""
        self._ready: deque[DueDelivery] = deque()
        """Holding their destination's and tenant's slots, waiting for a global one."""

    def __contains__(self, delivery_id: object) -> bool:
        return delivery_id in self._ours

    def __len__(self) -> int:
        return len(self._ours)

    def ids(self) -> set[str]:
        """The ids of the deliveries held (a copy)."""
        return set(self._ours)

    @property
    def parked(self) -> int:
        """Held deliveries beyond their destination's or tenant's limit."""
        return self.total - self._used

    def free(self) -> int:
        """Deliveries the dispatcher can take on now (parked ones take no room)."""
        return self._budget - self._used

    def can_begin(self) -> bool:
        """A global slot is free, and not too many finished attempts wait to be written
        (a stalled database holds new attempts back rather than letting what a crash
        would send again grow with the stall)."""
        return self.running < self._max_concurrency and self._unwritten() < self._max_unwritten

    def admit(self, item: DueDelivery) -> bool:
        """Hold ``item`` and start it if its slots are free; False if it is held already
        (claimed again while ours: one attempt is enough)."""
        if item.id in self._ours:
            return False
        self._ours.add(item.id)
        self.total += 1
        dest = item.destination_id
        tenant = item.event.tenant_id
        n = self.outstanding[dest] = self.outstanding[dest] + 1
        if n <= self._per_destination:
            e = self.tenant_load[tenant] = self.tenant_load.get(tenant, 0) + 1
            if e <= self._per_tenant:
                self._used += 1
        if self._take(
            item, dest, self._destination_slots, self._per_destination, self._destination_waiting
        ):
            self._to_tenant(item, tenant)
        return True

    def _to_tenant(self, item: DueDelivery, tenant: str) -> None:
        """``item`` holds its destination's slot: on to its tenant's, then a global one."""
        if not self._take(item, tenant, self._tenant_slots, self._per_tenant, self._tenant_waiting):
            return
        if self._ready or not self.can_begin():
            self._ready.append(item)
        else:
            self.running += 1
            self._begin(item)

    def start_ready(self) -> None:
        """Start what waits for a global slot, as far as there is room (after a release,
        or once records were written)."""
        ready = self._ready
        while ready and self.can_begin():
            self.running += 1
            self._begin(ready.popleft())

    def _forget(self, item: DueDelivery) -> tuple[int, int]:
        """Stop counting ``item``; its destination's outstanding and its tenant's load
        then."""
        self._ours.discard(item.id)
        self.total -= 1
        dest = item.destination_id
        tenant = item.event.tenant_id
        n = self.outstanding[dest]
        if n <= 1:
            del self.outstanding[dest]
        else:
            self.outstanding[dest] = n - 1
        load = self.tenant_load.get(tenant, 0)
        if n <= self._per_destination:
            if load <= 1:
                del self.tenant_load[tenant]
            else:
                self.tenant_load[tenant] = load - 1
            if load <= self._per_tenant:
                self._used -= 1
            load -= 1
        return n - 1, load

    def release(self, item: DueDelivery) -> bool:
        """``item``'s attempt ended: its slots pass to who waits for them. True when this
        makes room a claim can use (its destination or tenant stops being skipped, or
        the budget reopens), so the claim loop is worth waking."""
        left, load = self._forget(item)
        self.running -= 1
        dest = item.destination_id
        tenant = item.event.tenant_id
        # The tenant's slot first, to its oldest delivery that holds a destination slot.
        waiting = self._tenant_waiting.get(tenant)
        if waiting:
            self._ready.append(waiting.popleft())
            if not waiting:
                del self._tenant_waiting[tenant]
        else:
            self._put_back(self._tenant_slots, tenant)
        # Then the destination's, to its next delivery (of the same tenant).
        waiting = self._destination_waiting.get(dest)
        if waiting:
            following = waiting.popleft()
            if not waiting:
                del self._destination_waiting[dest]
            self._to_tenant(following, tenant)
        else:
            self._put_back(self._destination_slots, dest)
        self.start_ready()
        return (
            left == self._destination_enough - 1
            or load == self._tenant_enough - 1
            or self._used == self._budget - 1
        )

    @staticmethod
    def _take(
        item: DueDelivery,
        key: str,
        slots: dict[str, int],
        limit: int,
        waiting: dict[str, deque[DueDelivery]],
    ) -> bool:
        """Give ``item`` one of ``key``'s slots (a destination's or a tenant's), or queue
        it behind ``key``'s waiting deliveries when all ``limit`` are taken (False)."""
        taken = slots.get(key, 0)
        if taken >= limit:
            queue = waiting.get(key)
            if queue is None:
                queue = waiting[key] = deque()
            queue.append(item)
            return False
        slots[key] = taken + 1
        return True

    @staticmethod
    def _put_back(slots: dict[str, int], key: str) -> None:
        n = slots[key] - 1
        if n:
            slots[key] = n
        else:
            del slots[key]

    def unqueue(self) -> list[DueDelivery]:
        """Stopping: drop every delivery still waiting (none starts from now on); the
        running ones keep their slots. Returns the dropped."""
        ready = list(self._ready)
        tenant_waiting = [i for q in self._tenant_waiting.values() for i in q]
        queued = ready + tenant_waiting
        queued.extend(i for q in self._destination_waiting.values() for i in q)
        self._ready.clear()
        self._tenant_waiting.clear()
        self._destination_waiting.clear()
        # The slots they held: the ready ones a tenant's and a destination's, the ones
        # waiting for their tenant a destination's.
        for item in ready:
            self._put_back(self._tenant_slots, item.event.tenant_id)
        for item in ready + tenant_waiting:
            self._put_back(self._destination_slots, item.destination_id)
        for item in queued:
            self._forget(item)
        return queued

    def abandon(self) -> None:
        """Given up at shutdown: forget every delivery (what still ends is not ours)."""
        self._ours.clear()
        self._ready.clear()
        self._tenant_waiting.clear()
        self._destination_waiting.clear()
