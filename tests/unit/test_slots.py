"""The dispatcher's slot arithmetic (herald.slots), on its own: no database, no loop."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.support.examples import examples

from herald.config import DeliverySettings
from herald.model import DeliveryKind, DueDelivery, Event
from herald.slots import CLAIM_BUDGET_FACTOR, Slots

_ids = itertools.count()

DESTINATIONS = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "c1": "C"}
"""Destinations and their tenants: a destination belongs to one tenant."""


def item(dest: str, tenant: str | None = None) -> DueDelivery:
    tenant = tenant or DESTINATIONS.get(dest, "default")
    event = Event(f"evt_{next(_ids)}", tenant, "t.x", "2026-01-01T00:00:00Z", 0.0, b"{}")
    return DueDelivery(f"dlv_{next(_ids)}", dest, DeliveryKind.EVENT, 0, 0, event)


class Started(list[DueDelivery]):
    """The ``begin`` callback: every delivery given a global slot, in order."""

    def __call__(self, item: DueDelivery) -> None:
        self.append(item)


def slots(
    started: Started,
    *,
    concurrency: int = 4,
    per_destination: int = 2,
    per_tenant: int = 3,
    enough: int = 5,
    tenant_enough: int = 6,
    unwritten: list[int] | None = None,
    max_unwritten: int | None = None,
) -> Slots:
    box = unwritten if unwritten is not None else [0]
    return Slots(
        max_concurrency=concurrency,
        max_per_destination=per_destination,
        max_per_tenant=per_tenant,
        destination_enough=enough,
        tenant_enough=tenant_enough,
        begin=started,
        unwritten=lambda: box[0],
        max_unwritten=max_unwritten,
    )


# --- examples ----------------------------------------------------------------------
def test_a_destination_runs_up_to_its_cap_and_the_rest_wait_in_order() -> None:
    started = Started()
    s = slots(started, per_destination=2, per_tenant=9, concurrency=9)
    items = [item("d", "t") for _ in range(5)]
    for i in items:
        assert s.admit(i)
    assert started == items[:2]
    assert (s.total, s.running, s.parked) == (5, 2, 3)
    s.release(items[0])
    assert started == items[:3]
    assert s.outstanding == {"d": 4}
    assert s.tenant_load == {"t": 2}  # what its destination's cap lets run


def test_a_tenant_runs_up_to_its_cap_over_all_its_destinations() -> None:
    started = Started()
    s = slots(started, per_destination=2, per_tenant=3, concurrency=8)
    mine = [item(d, "A") for d in ("a1", "a1", "a2", "a2", "a3")]
    theirs = [item("b1", "B"), item("b1", "B")]
    for i in mine + theirs:
        s.admit(i)
    # A takes its 3 slots; B its own, though A's deliveries came first.
    assert started == mine[:3] + theirs
    assert s.parked == 2  # A's 5 have room for 3
    # A slot of A frees: its oldest waiting delivery (holding a slot of a2) starts.
    s.release(mine[0])
    assert started[-1] is mine[3]
    s.release(mine[1])
    assert started[-1] is mine[4]


def test_parked_deliveries_take_no_claim_budget() -> None:
    started = Started()
    s = slots(started, concurrency=4, per_destination=2, per_tenant=3)
    budget = CLAIM_BUDGET_FACTOR * 4
    assert s.free() == budget
    for _ in range(10):
        s.admit(item("a1", "A"))  # beyond 2 for a1: parked
    assert s.free() == budget - 2
    for d in ("a2", "a3"):
        for _ in range(10):
            s.admit(item(d, "A"))  # A can run 3 whatever its destinations hold
    assert s.free() == budget - 3
    assert s.parked == 27


def test_a_slow_destinations_backlog_does_not_load_its_tenant() -> None:
    """Claims skip a tenant by its load: its one slow destination's backlog (parked
    behind that destination's limit) must not stop its other destinations' claims."""
    started = Started()
    s = slots(started, per_destination=2, per_tenant=3)
    for _ in range(50):
        s.admit(item("a1", "A"))
    assert s.tenant_load == {"A": 2}
    s.admit(item("a2", "A"))
    assert s.tenant_load == {"A": 3}


def test_a_delivery_held_already_is_not_admitted_twice() -> None:
    started = Started()
    s = slots(started)
    i = item("a1")
    assert s.admit(i)
    assert not s.admit(i)
    assert (s.total, started) == (1, [i])
    assert i.id in s
    assert s.ids() == {i.id}


def test_unwritten_records_hold_new_attempts_back() -> None:
    started = Started()
    backlog = [5]
    s = slots(started, concurrency=4, unwritten=backlog, max_unwritten=5)
    first = item("a1")
    s.admit(first)
    assert started == []  # waits in the ready queue: too many records unwritten
    backlog[0] = 4
    s.start_ready()
    assert started == [first]


def test_a_release_says_when_a_claim_could_use_the_room() -> None:
    started = Started()
    s = slots(started, concurrency=100, per_destination=1, per_tenant=100, enough=3)
    items = [item("a1", "A") for _ in range(3)]
    for i in items:
        s.admit(i)
    assert s.release(items[0])  # a1 falls below `enough`: claims take it again
    assert not s.release(items[1])


def test_a_release_says_when_a_tenant_stops_being_skipped() -> None:
    started = Started()
    s = slots(started, concurrency=100, per_destination=100, per_tenant=1, tenant_enough=2)
    one, two = item("a1", "A"), item("a2", "A")
    s.admit(one)
    s.admit(two)
    assert s.release(one)


def test_a_release_says_when_the_budget_reopens() -> None:
    started = Started()
    s = slots(started, concurrency=1, per_destination=9, per_tenant=9, enough=99)
    items = [item(f"d{n}", "t") for n in range(CLAIM_BUDGET_FACTOR)]
    for i in items:
        s.admit(i)
    assert s.free() == 0
    assert s.release(items[0])


def test_unqueue_drops_what_waits_and_keeps_what_runs() -> None:
    started = Started()
    s = slots(started, concurrency=2, per_destination=1, per_tenant=9)
    items = [item("a1", "A"), item("a1", "A"), item("b1", "B"), item("c1", "C")]
    for i in items:
        s.admit(i)
    assert started == [items[0], items[2]]
    dropped = s.unqueue()
    assert sorted(d.id for d in dropped) == sorted(d.id for d in (items[1], items[3]))
    assert (s.total, s.running, s.parked) == (2, 2, 0)
    assert s.ids() == {items[0].id, items[2].id}
    s.release(items[0])
    s.release(items[2])
    assert (s.total, s.running, s.free()) == (0, 0, CLAIM_BUDGET_FACTOR * 2)
    assert s.outstanding == {}
    assert s.tenant_load == {}
    assert len(started) == 2


def test_the_tenant_cap_leaves_the_others_a_destinations_share_unless_set() -> None:
    # 256 less one destination's 64: two hanging destinations of a tenant leave its
    # healthy ones 64, and the other tenants always keep 64.
    assert DeliverySettings().tenant_cap == 192
    # Never below half of the concurrency (a destination's share larger than half).
    assert DeliverySettings(max_concurrency=9).tenant_cap == 4
    assert DeliverySettings(max_concurrency=100, max_per_destination=10).tenant_cap == 90
    assert DeliverySettings(max_concurrency=1).tenant_cap == 1
    assert DeliverySettings(max_per_tenant=256).tenant_cap == 256


# --- properties --------------------------------------------------------------------
class SlotsMachine(RuleBasedStateMachine):
    """Deliveries of six destinations of three tenants admitted, ended and unqueued in
    any order, with records piling up and being written, against a plain model."""

    def __init__(self) -> None:
        super().__init__()
        self.started = Started()
        self.unwritten = [0]
        self.s: Slots | None = None
        self.admitted: list[DueDelivery] = []
        self.ended: set[str] = set()
        self.dropped: set[str] = set()
        self.stopped = False

    @rule(
        concurrency=st.integers(1, 6),
        per_destination=st.integers(1, 4),
        per_tenant=st.integers(1, 6),
        enough=st.integers(1, 8),
        tenant_enough=st.integers(1, 8),
    )
    @precondition(lambda self: self.s is None)
    def build(
        self,
        concurrency: int,
        per_destination: int,
        per_tenant: int,
        enough: int,
        tenant_enough: int,
    ) -> None:
        self.caps = (concurrency, per_destination, per_tenant)
        self.s = slots(
            self.started,
            concurrency=concurrency,
            per_destination=per_destination,
            per_tenant=per_tenant,
            enough=enough,
            tenant_enough=tenant_enough,
            unwritten=self.unwritten,
            max_unwritten=3,
        )

    @precondition(lambda self: self.s is not None and not self.stopped)
    @rule(dest=st.sampled_from(sorted(DESTINATIONS)), again=st.booleans())
    def admit(self, dest: str, again: bool) -> None:
        assert self.s is not None
        held = [i for i in self.admitted if i.id in self.s]
        if again and held:
            assert not self.s.admit(held[0])  # one attempt is enough
            return
        new = item(dest)
        assert self.s.admit(new)
        self.admitted.append(new)

    @precondition(lambda self: self.s is not None and self.running())
    @rule(data=st.data(), records=st.booleans())
    def end(self, data: st.DataObject, records: bool) -> None:
        assert self.s is not None
        done = data.draw(st.sampled_from(self.running()))
        if records:
            self.unwritten[0] += 1
        self.s.release(done)
        self.ended.add(done.id)

    @precondition(lambda self: self.s is not None)
    @rule()
    def written(self) -> None:
        assert self.s is not None
        self.unwritten[0] = 0
        self.s.start_ready()

    @precondition(lambda self: self.s is not None and not self.stopped)
    @rule()
    def stop(self) -> None:
        assert self.s is not None
        dropped = self.s.unqueue()
        ids = {d.id for d in dropped}
        assert not ids & {d.id for d in self.started}  # only what had not started
        self.dropped |= ids
        self.stopped = True

    def running(self) -> list[DueDelivery]:
        return [i for i in self.started if i.id not in self.ended]

    def waiting(self) -> list[DueDelivery]:
        begun = {i.id for i in self.started}
        return [i for i in self.admitted if i.id not in begun and i.id not in self.dropped]

    @invariant()
    def the_limits_hold(self) -> None:
        if self.s is None:
            return
        concurrency, per_destination, per_tenant = self.caps
        running = self.running()
        assert len(running) == self.s.running <= concurrency
        assert all(
            n <= per_destination for n in Counter(i.destination_id for i in running).values()
        )
        assert all(n <= per_tenant for n in Counter(i.event.tenant_id for i in running).values())

    @invariant()
    def each_starts_once_and_in_order_per_destination(self) -> None:
        ids = [i.id for i in self.started]
        assert len(ids) == len(set(ids))
        position = {i.id: n for n, i in enumerate(self.admitted)}
        for dest in DESTINATIONS:
            order = [position[i.id] for i in self.started if i.destination_id == dest]
            assert order == sorted(order)

    @invariant()
    def no_freed_slot_is_lost(self) -> None:
        """Whatever waits, waits for a limit that is full: a freed slot never sits idle
        while a delivery that could take it waits."""
        if self.s is None:
            return
        concurrency, per_destination, per_tenant = self.caps
        running = self.running()
        per_dest = Counter(i.destination_id for i in running)
        per_ten = Counter(i.event.tenant_id for i in running)
        global_full = len(running) >= concurrency or self.unwritten[0] >= 3
        for w in self.waiting():
            assert (
                global_full
                or per_dest[w.destination_id] >= per_destination
                or per_ten[w.event.tenant_id] >= per_tenant
            ), f"{w.destination_id} waits with free slots"

    @invariant()
    def the_counts_match_what_is_held(self) -> None:
        if self.s is None:
            return
        concurrency, per_destination, per_tenant = self.caps
        held = [i for i in self.admitted if i.id not in self.ended and i.id not in self.dropped]
        assert self.s.total == len(self.s) == len(held)
        assert self.s.ids() == {i.id for i in held}
        assert self.s.outstanding == Counter(i.destination_id for i in held)
        # What can run soon: per tenant, what its destinations' limits let run, capped.
        load: Counter[str] = Counter()
        for dest, n in Counter(i.destination_id for i in held).items():
            load[DESTINATIONS[dest]] += min(n, per_destination)
        assert self.s.tenant_load == load
        used = sum(min(e, per_tenant) for e in load.values())
        assert self.s.free() == CLAIM_BUDGET_FACTOR * concurrency - used
        assert self.s.parked == len(held) - used

    def teardown(self) -> None:
        """Ending every attempt (and writing their records) starts, then ends, all the
        rest: nothing is stranded."""
        if self.s is None:
            return
        for _ in range(10_000):
            self.unwritten[0] = 0
            self.s.start_ready()
            running = self.running()
            if not running:
                break
            self.s.release(running[0])
            self.ended.add(running[0].id)
        assert self.s.total == 0
        assert self.s.running == 0
        assert {i.id for i in self.started} | self.dropped == {i.id for i in self.admitted}


SlotsMachine.TestCase.settings = settings(
    max_examples=examples(200),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_slots_keep_their_limits = SlotsMachine.TestCase
