"""The store's part on the engine's path: the relay's claim of outbox rows, the
dispatcher's claim and leases of due deliveries, the recorder's write of attempts
with what they signal, and the instances that hold leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import orjson

from herald.errors import Conflict, StorageError
from herald.flow import CLOSED, BreakerSettings, admit, allowance
from herald.model import (
    AttemptRecord,
    DeliveryKind,
    DeliveryStatus,
    DueDelivery,
    Instance,
    OutboxRow,
    Recorded,
    RelayPlan,
)
from herald.signals import (
    DestinationState,
    circuits,
    destinations_of,
    ended_in_failure,
    episodes,
    exhausted,
    outbox_row,
    verification_failed,
)
from herald.store.base import STALE_CATALOG, RelayProcessor
from herald.store.counters import count_attempts
from herald.store.dialect import Claim, Conn, Row
from herald.store.part import StorePart
from herald.store.rows import (
    attempt_to_row,
    event_from_row,
    flow_from_row,
    instance_from_row,
    instance_to_row,
)


class EngineStore(StorePart):
    """The outbox, due deliveries and their leases, recorded attempts, instances."""

    failing_after: int
    """The consecutive failed attempts that make a destination failing."""
    breaker: BreakerSettings = BreakerSettings()
    """When circuits open and for how long (``delivery.breaker_*``, herald.flow)."""
    # After a relay pass that found the outbox empty, the next one first looks with
    # a plain read where the dialect wants it (SQLite: no lock in WAL mode) and
    # writes only when there are rows: an idle relay polls often, and must not
    # hold up a producer's transaction 50 times a second.
    _outbox_idle: bool = False
    _outbox_watched: bool = False

    # --- outbox -----------------------------------------------------------
    async def relay(
        self,
        limit: int,
        process: RelayProcessor,
        *,
        destinations_version: int | None = None,
        ordered: bool = False,
    ) -> tuple[RelayPlan, int]:
        """Claim up to ``limit`` outbox rows in ``seq`` order, apply ``process``'s plan
        and delete the rows, all in one transaction; returns the plan and the row count.

        With ``destinations_version``, nothing is claimed and the count is
        ``STALE_CATALOG`` when destinations changed since the caller's catalog was
        built: fanning out with it could miss a destination created just before.

        Deliveries planned with a ``lease_owner`` are stored claimed by it; the
        plan's ``leased`` lists those that really are. One the committed status of
        its destination holds (a change after the version check) is stored unleased
        and due now instead, and one whose destination is gone is not stored.

        ``ordered``: some destination is ordered (herald.ordering): the pass takes the
        order lock first, so that passes on several instances take the rows, and
        number their deliveries, one after the other."""
        d = self.dialect
        if self._outbox_idle and not await d.read("outbox_any"):
            return RelayPlan(), 0
        self._outbox_idle = False

        async def batch(c: Conn) -> tuple[RelayPlan, int]:
            if not await self._relay_fence(
                c, ordered=ordered, destinations_version=destinations_version
            ):
                return RelayPlan(), STALE_CATALOG
            rows = [OutboxRow(*r) for r in await d.fetch(c, "relay_claim", limit)]
            if not rows:
                self._outbox_idle = d.idle_read
                return RelayPlan(), 0
            ids = [r.id.decode("utf-8", "replace") for r in rows if r.id is not None]
            existing = {(r[0], r[1]) for r in await d.fetch(c, "relay_existing", ids)}
            plan = process(rows, existing)
            now = time.time()
            await self._write_plan(c, plan, now, "herald")
            await d.execute(c, "relay_delete", *d.outbox_delete_args(rows))
            return plan, len(rows)

        return await d.transact(batch)

    async def watch_outbox(
        self, callback: Callable[[], None], *, every: float, listening: asyncio.Event | None = None
    ) -> bool:
        """Call ``callback`` when producers may have inserted outbox rows (PostgreSQL
        notifies; on SQLite a cheap look every ``every`` seconds, while ``listening``
        is set); False if unsupported.

        A store has one watcher, its relay: a second call is refused (RuntimeError)
        rather than left to the dialect, where SQLite would ignore its callback and
        PostgreSQL open a second listening connection and forget the first."""
        if self._outbox_watched:
            raise RuntimeError("the outbox is watched already: one watcher per store")
        self._outbox_watched = True
        return await self.dialect.watch_outbox(callback, every=every, listening=listening)

    async def insert_outbox(
        self,
        *,
        id: str,
        tenant_id: str,
        type: str,
        data: bytes,
        created_at: str,
        traceparent: str | None = None,
        ordering_key: str | None = None,
    ) -> None:
        d = self.dialect
        exists = Conflict(f"event {id} already exists", field="id", code="event_exists")
        try:
            async with d.tx() as c:
                inserted = await d.execute(
                    c,
                    "insert_outbox",
                    id,
                    tenant_id,
                    type,
                    data.decode(),
                    created_at,
                    traceparent,
                    ordering_key,
                )
                # With concurrent writers, the relay may move an outbox row with this id
                # to herald_events while the INSERT runs: its NOT EXISTS read the older
                # snapshot. A new statement sees that commit; finding the event, roll back.
                if not inserted or (
                    d.shared and await d.fetchval(c, "event_exists", id, tenant_id)
                ):
                    raise exists
        except StorageError as exc:
            if d.is_unique_violation(exc.__cause__):
                raise exists from exc.__cause__
            raise

    async def outbox_stats(self) -> tuple[int, float | None]:
        """Pending outbox rows and the ``created_at`` epoch of the oldest, if any."""
        count, oldest = (await self.dialect.read("outbox_stats", gauges=True))[0]
        return int(count), self.dialect.oldest_epoch(oldest)

    # --- dispatch ---------------------------------------------------------
    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        owner: str,
        lease_until: float,
        exclude_destinations: Sequence[str] = (),
        due_since: float | None = None,
        exclude_tenants: Sequence[str] = (),
        gates: dict[str, float] | None = None,
    ) -> list[DueDelivery]:
        """Lease up to ``limit`` due deliveries of unheld destinations, oldest first,
        none of ``exclude_destinations`` or of ``exclude_tenants``; with ``due_since``,
        only those due since then (the caller knows that the older ones are all of the
        excluded).

        Event deliveries of a destination under flow control (herald.flow) are taken
        only as far as its rate has tokens and its circuit allows (one probe when it
        is due); none while its gate is shut. ``gates``, when given, receives the gate
        of each such destination this claim met (destination id → the time before
        which claims skip it)."""
        d = self.dialect
        want = Claim(
            now, limit, owner, lease_until, exclude_destinations, due_since, exclude_tenants
        )

        async def lease(c: Conn) -> tuple[list[Row], int, list[Row]]:
            # The flow lanes first, as far as their gates let (a few each): a common
            # backlog must not starve a rate that the receiver allows.
            lanes = await self._claim_lanes(c, want, gates)
            claimed = lanes
            if len(lanes) < limit:
                claimed = lanes + await d.claim(c, want._replace(limit=limit - len(lanes)))
            if claimed:
                claimed = await self._flow(c, claimed, want, gates)
            if not claimed:
                return [], 0, []
            # Every tenant's event of each id comes back: a delivery takes its tenant's.
            ids = list({r[6] for r in claimed})
            return claimed, len(lanes), await d.fetch(c, "events_by_id", ids)

        claimed, lanes, event_rows = await d.transact(lease)
        if not claimed:
            return []
        events = {(e.tenant_id, e.id): e for e in map(event_from_row, event_rows)}
        return [
            DueDelivery(
                r[0],
                r[1],
                DeliveryKind(r[2]),
                r[3],
                r[4],
                events[r[5], r[6]],
                r[7],
                ordering_key=r[9],
                owner=None if r[9] is None else owner,
                flow_lane=i < lanes,
            )
            for i, r in enumerate(claimed)
        ]

    async def _claim_lanes(self, c: Conn, want: Claim, gates: dict[str, float] | None) -> list[Row]:
        """Inside the claim's transaction: lease from the flow lane of each destination
        under flow control (``flow = 1``, herald_deliveries_flow) what its gate lets
        begin now (``herald.flow.allowance``, as committed; :meth:`_flow` admits them
        under the row's lock), up to ``want.limit``; none of ``want.exclude``. A shut
        gate costs an index probe, never a read of the backlog behind it."""
        takes: list[tuple[str, int]] = []
        room = want.limit
        skipped = set(want.exclude)
        for flow in map(flow_from_row, await self.dialect.fetch(c, "flow_due", want.now)):
            dest_id = flow.destination_id
            if dest_id in skipped:
                continue
            shut = flow.gate_until > want.now  # (a tenth of a second's tokens: herald.flow)
            n = 0 if shut else min(allowance(flow, want.now), room)
            if n > 0:
                takes.append((dest_id, n))
                room -= n
                if not room:
                    break
            elif gates is not None:
                gates[dest_id] = flow.gate_until
        if not takes:
            return []
        return await self.dialect.claim_flow(c, want, takes)

    async def _flow(
        self, c: Conn, claimed: list[Row], want: Claim, gates: dict[str, float] | None
    ) -> list[Row]:
        """Inside the claim's transaction: keep of ``claimed`` what the flow of each
        destination lets start (``herald.flow.admit``, under its row lock: the budget
        every instance shares); the rest are due again as they were, never claimed."""
        flowing: dict[str, list[Row]] = {}
        for r in claimed:
            if r[8] and r[2] == DeliveryKind.EVENT.value:
                flowing.setdefault(str(r[1]), []).append(r)
        if not flowing:
            return claimed  # no destination under flow control: no row to lock
        flows = await self._lock_flows(c, flowing)
        if not flows:
            return claimed
        dropped: set[str] = set()
        back: list[tuple[object, ...]] = []
        for dest_id, flow in flows.items():
            rows = sorted(flowing[dest_id], key=lambda r: float(r[7]))  # the oldest first
            kept = admit(flow, len(rows), want.now, probe_timeout=want.lease_until - want.now)
            for r in rows[kept:]:
                dropped.add(str(r[0]))
                back.append((r[7], r[0], want.owner))
            if gates is not None:
                gates[dest_id] = flow.gate_until
        if back:
            await self.dialect.executemany(c, "unclaim", back)
        await self._write_flows(c, flows.values())
        return [r for r in claimed if r[0] not in dropped]

    async def renew_leases(self, ids: Sequence[str], *, owner: str, until: float) -> int:
        """Extend the leases ``owner`` holds on ``ids`` (attempts still running)."""
        if not ids:
            return 0
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.execute(c, "renew_leases", until, owner, list(ids))

    async def unclaim(self, deliveries: Sequence[tuple[str, float]], *, owner: str) -> int:
        """Give back claimed deliveries not attempted (``(id, due_at)``): due again as
        they were, for any instance (an opened circuit stops them, herald.flow)."""
        if not deliveries:
            return 0
        async with self.dialect.tx() as c:
            await self.dialect.executemany(c, "unclaim", [(due, i, owner) for i, due in deliveries])
        return len(deliveries)

    async def release_leases(self, *, owner: str | None, now: float) -> int:
        """Make leased deliveries due now (``owner`` None: every owner's)."""
        async with self.dialect.tx(atomic=False) as c:
            if owner is None:
                return await self.dialect.execute(c, "release_all_leases", now)
            return await self.dialect.execute(c, "release_leases", now, owner)

    async def next_due_at(self, *, tenant_id: str | None = None) -> float | None:
        """Earliest ``next_attempt_at`` of an unheld pending delivery (of ``tenant_id``'s
        destinations when given)."""
        value = (await self._read_for("next_due_at", "tenant_next_due_at", tenant_id))[0][0]
        return None if value is None else float(value)

    async def delivery_counts(self, *, now: float, tenant_id: str | None = None) -> dict[str, int]:
        """Pending deliveries by state: ``due``, ``scheduled_retry``, ``held`` (of
        ``tenant_id``'s destinations when given)."""
        rows = await self._read_for(
            "delivery_counts", "tenant_delivery_counts", tenant_id, now, gauges=True
        )
        due, scheduled, held = (int(v) for v in rows[0])
        return {"due": due, "scheduled_retry": scheduled, "held": held}

    # --- recording --------------------------------------------------------
    async def record_attempts(self, records: Sequence[AttemptRecord]) -> Recorded:
        """Store attempts and move their deliveries on, in one transaction, with what
        they signal: the destinations' signal state and the operational events it
        causes, written into the outbox (see :mod:`herald.signals`)."""
        if not records:
            return Recorded()
        d = self.dialect
        now = time.time()
        every, must = destinations_of(records)

        async def record(c: Conn) -> Recorded:
            # Before any delivery row: the lock order is destination, then deliveries.
            states = {
                str(r[0]): DestinationState(str(r[1]), int(r[2]), r[3])
                for r in await d.lock_for_attempts(c, every, must)
            }
            keyed = sorted(
                {
                    (r.item.destination_id, r.item.ordering_key)
                    for r in records
                    if r.item is not None and r.item.ordering_key is not None
                }
            )
            if keyed:
                # After the destinations, before the deliveries (herald.ordering).
                await d.fetch(c, "keys_lock", orjson.dumps(keyed).decode())
            await d.executemany(c, "insert_attempts", [attempt_to_row(r.attempt) for r in records])
            await d.executemany(
                c,
                "finish_attempts",
                [
                    (
                        r.status.value,
                        r.attempt.number,
                        r.next_attempt_at,
                        now,
                        r.attempt.id,
                        r.attempt.delivery_id,
                        None if r.item is None else r.item.owner,
                    )
                    for r in records
                ],
            )
            if keyed:
                # An ordered delivery that ended lets the next of its key go.
                ended = [
                    (r.attempt.delivery_id, now)
                    for r in records
                    if r.item is not None
                    and r.item.ordering_key is not None
                    and r.status is not DeliveryStatus.PENDING
                ]
                if ended:
                    await d.executemany(c, "release_next", ended)
            for r in records:
                if r.activates_destination is not None:
                    await self._activate_if_pending(
                        c, r.activates_destination, r.attempt.delivery_id, now
                    )
            recorded = await self._signal(c, records, states, now)
            # Last of all: the counters' rows are locked after every other row.
            await count_attempts(d, c, records)
            return recorded

        return await d.transact(record)

    async def _signal(
        self,
        c: Conn,
        records: Sequence[AttemptRecord],
        states: dict[str, DestinationState],
        now: float,
    ) -> Recorded:
        """Inside :meth:`record_attempts`' transaction: the signal state and events."""
        d = self.dialect
        failures = {i: st.consecutive_failures for i, st in states.items()}
        signals, changed = episodes(records, states, failing_after=self.failing_after, now=now)
        # The circuits (herald.flow) last: their rows are locked after the deliveries.
        flows = await self._lock_flows(
            c, (r.item.destination_id for r in records if r.item is not None), breakers=True
        )
        states_of: dict[str, float | None] = {}
        if flows:
            types = {i: st.type for i, st in states.items()}
            opened_closed, moved = circuits(
                records, flows, failures, types, settings=self.breaker, now=now
            )
            signals.extend(opened_closed)
            await self._write_flows(c, (flows[i] for i in sorted(moved)))
            states_of = {
                i: (f.opened_at or now) if f.circuit != CLOSED else None for i, f in flows.items()
            }
        if changed:
            await d.executemany(
                c,
                "set_signal_state",
                [
                    (states[i].consecutive_failures, states[i].failing_since, i)
                    for i in sorted(changed)
                ],
            )
        worn: list[str] = []
        final = ended_in_failure(records)
        if final:
            # Only the recording whose attempt ended the delivery signals it: not one of
            # a delivery that a delete or a new verification ended meanwhile.
            ended = {
                str(row[0]): (row[1], str(row[2]))
                for row in await d.fetch(
                    c, "finished_failed", [r.attempt.delivery_id for r in final]
                )
            }
            for r in final:
                last_attempt, dest_type = ended.get(r.attempt.delivery_id, (None, ""))
                if last_attempt != r.attempt.id:
                    continue
                assert r.item is not None
                if r.item.kind is DeliveryKind.EVENT:
                    worn.append(dest_type)
                    signal = exhausted(r, dest_type)
                    if signal is not None:
                        signals.append(signal)
                elif await d.execute(
                    c, "verification_failed", now, r.attempt.error, r.item.destination_id
                ):
                    signals.append(verification_failed(r, dest_type))
        if signals:
            await d.executemany(
                c, "insert_signal", [outbox_row(s, now, self._box) for s in signals]
            )
        return Recorded(signals, worn, states_of)

    async def _activate_if_pending(
        self, c: Conn, dest_id: str, delivery_id: str, now: float
    ) -> None:
        if await self.dialect.execute(c, "activate_destination", now, dest_id, delivery_id):
            await self._set_held(c, dest_id, held=False)
            await self.dialect.execute(c, "bump_version")

    # --- instances --------------------------------------------------------
    async def heartbeat(self, instance: Instance, *, now: float) -> bool:
        """Record that ``instance`` lives; False if its row was missing (new, or reaped)."""
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.heartbeat(c, instance_to_row(instance, heartbeat_at=now))

    async def reap_instances(self, *, stale_before: float, now: float) -> dict[str, int]:
        """Forget instances silent since before ``stale_before`` and make the deliveries
        they leased due ``now``, in one transaction; ``{instance id: released}``."""
        async with self.dialect.tx() as c:
            return await self.dialect.reap(c, stale_before=stale_before, now=now)

    async def list_instances(self) -> list[Instance]:
        """Every registered instance, oldest first."""
        return [instance_from_row(r) for r in await self.dialect.read("list_instances")]

    async def remove_instance(self, instance_id: str) -> None:
        """Unregister an instance that stops cleanly."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "remove_instance", instance_id)
