"""Every store operation, once, over a :class:`~herald.store.dialect.Dialect`.

The statements are the dialect's named queries (``store/sql/<dialect>/queries.sql``),
called with the same arguments on both databases; what differs (connections,
transactions, list parameters, a few whole algorithms) is the dialect's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Generic, Literal, TypeVar

from herald.crypto import SecretBox
from herald.errors import Conflict, StorageError
from herald.ingest import Reject, parse_row
from herald.model import (
    AttemptRecord,
    Delivery,
    DeliveryFilter,
    DeliveryKind,
    Destination,
    DestinationStatus,
    DueDelivery,
    Event,
    Instance,
    NewDelivery,
    OutboxRow,
    Recorded,
    RelayPlan,
    Replay,
    ReplayOutcome,
)
from herald.signals import (
    DEFAULT_FAILING_AFTER,
    DestinationState,
    destinations_of,
    ended_in_failure,
    episodes,
    exhausted,
    outbox_row,
    verification_failed,
)
from herald.store.base import (
    STALE_CATALOG,
    ApiKeyInfo,
    ConsoleSession,
    IdempotencyRecord,
    RelayProcessor,
    TokenRow,
    TokenState,
)
from herald.store.dialect import Claim, Conn, Dialect
from herald.store.rows import (
    attempt_from_row,
    attempt_to_row,
    delivery_from_row,
    destination_from_row,
    destination_to_row,
    event_from_row,
    instance_from_row,
    instance_to_row,
    new_delivery_rows,
    reencrypt_rows,
    replay_from_row,
    replay_outcomes,
    replay_to_row,
)

D = TypeVar("D", bound=Dialect)

_REJECTED_KEYS = ("seq", "id", "tenant_id", "type", "data", "created_at", "reason", "rejected_at")


class SQLStore(Generic[D]):
    """The store (``herald.store.Store``): every operation once, over a dialect.

    ``shared``: whether several instances may use this database at once (PostgreSQL).
    ``failing_after``: the consecutive failed attempts that make a destination
    failing (``signals.failing_after_attempts``, see :mod:`herald.signals`)."""

    def __init__(
        self, dialect: D, *, box: SecretBox, failing_after: int = DEFAULT_FAILING_AFTER
    ) -> None:
        self.dialect = dialect
        self.shared = dialect.shared
        self._box = box
        self.failing_after = failing_after
        # After a relay pass that found the outbox empty, the next one first looks with
        # a plain read where the dialect wants it (SQLite: no lock in WAL mode) and
        # writes only when there are rows: an idle relay polls often, and must not
        # hold up a producer's transaction 50 times a second.
        self._outbox_idle = False

    # --- lifecycle --------------------------------------------------------
    async def open(self) -> None:
        """Connect and apply pending migrations."""
        await self.dialect.open()

    async def close(self) -> None:
        await self.dialect.close()

    async def ping(self) -> None:
        """Raise StorageError unless the database answers."""
        await self.dialect.ping()

    async def schema_version(self) -> int:
        rows = await self.dialect.read("schema_version")
        return int(rows[0][0] or 0)

    # --- outbox -----------------------------------------------------------
    async def relay(
        self, limit: int, process: RelayProcessor, *, destinations_version: int | None = None
    ) -> tuple[RelayPlan, int]:
        """Claim up to ``limit`` outbox rows in ``seq`` order, apply ``process``'s plan
        and delete the rows, all in one transaction; returns the plan and the row count.

        With ``destinations_version``, nothing is claimed and the count is
        ``STALE_CATALOG`` when destinations changed since the caller's catalog was
        built: fanning out with it could miss a destination created just before.

        Deliveries planned with a ``lease_owner`` are stored claimed by it; the
        plan's ``leased`` lists those that really are. One the committed status of
        its destination holds (a change after the version check) is stored unleased
        and due now instead, and one whose destination is gone is not stored."""
        d = self.dialect
        if self._outbox_idle and not await d.read("outbox_any"):
            return RelayPlan(), 0
        self._outbox_idle = False
        async with d.tx() as c:
            if destinations_version is not None:
                current = await d.fetchval(c, "destinations_version")
                if int(current) != destinations_version:
                    return RelayPlan(), STALE_CATALOG
            rows = [OutboxRow(*r) for r in await d.fetch(c, "relay_claim", limit)]
            if not rows:
                self._outbox_idle = d.idle_read
                return RelayPlan(), 0
            ids = [r.id.decode("utf-8", "replace") for r in rows if r.id is not None]
            existing = {(r[0], r[1]) for r in await d.fetch(c, "relay_existing", ids)}
            plan = process(rows, existing)
            now = time.time()
            await self._insert_events(c, plan.events, now)
            plan.leased = await self._insert_deliveries(c, plan.deliveries, now)
            if plan.rejected:
                await d.executemany(
                    c,
                    "relay_reject",
                    [
                        (r.seq, r.id, r.tenant_id, r.type, r.data, r.created_at, r.reason, now)
                        for r in plan.rejected
                    ],
                )
            await d.execute(c, "relay_delete", *d.outbox_delete_args(rows))
            return plan, len(rows)

    async def _insert_events(self, c: Conn, events: Iterable[Event], now: float) -> None:
        await self.dialect.insert_many(
            c,
            "insert_events",
            [
                (
                    e.id,
                    e.tenant_id,
                    e.type,
                    e.data.decode(),
                    e.created_at,
                    e.created_ts,
                    now,
                    e.traceparent,
                )
                for e in events
            ],
        )

    async def _insert_deliveries(
        self, c: Conn, rows: Sequence[NewDelivery], now: float
    ) -> list[str]:
        """Store ``rows``; returns the ids stored leased (see :func:`new_delivery_rows`).
        The statuses are read once per call, inside the caller's write transaction."""
        if not rows:
            return []
        dest_ids = list({d.destination_id for d in rows})
        statuses: dict[str, str] = {
            r[0]: r[1] for r in await self.dialect.fetch(c, "destination_statuses", dest_ids)
        }
        values, leased = new_delivery_rows(rows, statuses, now)
        await self.dialect.insert_many(c, "insert_deliveries", values)
        return leased

    async def insert_outbox(
        self,
        *,
        id: str,
        tenant_id: str,
        type: str,
        data: bytes,
        created_at: str,
        traceparent: str | None = None,
    ) -> None:
        d = self.dialect
        exists = Conflict(f"event {id} already exists", field="id", code="event_exists")
        try:
            async with d.tx() as c:
                inserted = await d.execute(
                    c, "insert_outbox", id, tenant_id, type, data.decode(), created_at, traceparent
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

    async def list_rejected(
        self, *, limit: int, tenant_id: str | None = None
    ) -> list[dict[str, object]]:
        """Rejected outbox rows, newest first: one tenant's, or (None) every tenant's."""
        rows = await self.dialect.read("list_rejected", limit, tenant_id)
        return [dict(zip(_REJECTED_KEYS, row, strict=True)) for row in rows]

    async def get_outbox_event(self, tenant_id: str, event_id: str) -> Event | None:
        """An event still waiting in the outbox, if it parses (for GET right after publish)."""
        rows = await self.dialect.read("outbox_event", event_id, tenant_id)
        if not rows:
            return None
        try:
            return parse_row(OutboxRow(*rows[0]), max_payload_bytes=1 << 62)
        except Reject:
            return None

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
    ) -> list[DueDelivery]:
        """Lease up to ``limit`` due deliveries of unheld destinations, oldest first;
        with ``due_since``, only those due since then (the caller knows that the older
        ones are all of ``exclude_destinations``)."""
        d = self.dialect
        async with d.tx() as c:
            want = Claim(now, limit, owner, lease_until, exclude_destinations, due_since)
            claimed = await d.claim(c, want)
            if not claimed:
                return []
            # Every tenant's event of each id comes back: a delivery takes its tenant's.
            events = {
                (e.tenant_id, e.id): e
                for e in map(
                    event_from_row,
                    await d.fetch(c, "events_by_id", list({r[6] for r in claimed})),
                )
            }
        return [
            DueDelivery(r[0], r[1], DeliveryKind(r[2]), r[3], r[4], events[r[5], r[6]], r[7])
            for r in claimed
        ]

    async def renew_leases(self, ids: Sequence[str], *, owner: str, until: float) -> int:
        """Extend the leases ``owner`` holds on ``ids`` (attempts still running)."""
        if not ids:
            return 0
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.execute(c, "renew_leases", until, owner, list(ids))

    async def watch_outbox(self, callback: Callable[[], None], *, every: float) -> bool:
        """Call ``callback`` when producers may have inserted outbox rows (PostgreSQL
        notifies; on SQLite a cheap look every ``every`` seconds); False if unsupported."""
        return await self.dialect.watch_outbox(callback, every=every)

    async def record_attempts(self, records: Sequence[AttemptRecord]) -> Recorded:
        """Store attempts and move their deliveries on, in one transaction, with what
        they signal: the destinations' signal state and the operational events it
        causes, written into the outbox (see :mod:`herald.signals`)."""
        if not records:
            return Recorded()
        d = self.dialect
        now = time.time()
        every, must = destinations_of(records)
        async with d.tx() as c:
            # Before any delivery row: the lock order is destination, then deliveries.
            states = {
                str(r[0]): DestinationState(str(r[1]), int(r[2]), r[3])
                for r in await d.lock_for_attempts(c, every, must)
            }
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
                    )
                    for r in records
                ],
            )
            for r in records:
                if r.activates_destination is not None:
                    await self._activate_if_pending(
                        c, r.activates_destination, r.attempt.delivery_id, now
                    )
            return await self._signal(c, records, states, now)

    async def _signal(
        self,
        c: Conn,
        records: Sequence[AttemptRecord],
        states: dict[str, DestinationState],
        now: float,
    ) -> Recorded:
        """Inside :meth:`record_attempts`' transaction: the signal state and events."""
        d = self.dialect
        signals, changed = episodes(records, states, failing_after=self.failing_after, now=now)
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
            await d.executemany(c, "insert_signal", [outbox_row(s, now) for s in signals])
        return Recorded(signals, worn)

    async def _activate_if_pending(
        self, c: Conn, dest_id: str, delivery_id: str, now: float
    ) -> None:
        if await self.dialect.execute(c, "activate_destination", now, dest_id, delivery_id):
            await self._set_held(c, dest_id, held=False)
            await self.dialect.execute(c, "bump_version")

    async def _set_held(self, c: Conn, dest_id: str, *, held: bool) -> None:
        await self.dialect.execute(c, "set_held", int(held), dest_id, int(not held))

    async def next_due_at(self) -> float | None:
        """Earliest ``next_attempt_at`` of an unheld pending delivery."""
        value = (await self.dialect.read("next_due_at"))[0][0]
        return None if value is None else float(value)

    async def release_leases(self, *, owner: str | None, now: float) -> int:
        """Make leased deliveries due now (``owner`` None: every owner's)."""
        async with self.dialect.tx(atomic=False) as c:
            if owner is None:
                return await self.dialect.execute(c, "release_all_leases", now)
            return await self.dialect.execute(c, "release_leases", now, owner)

    async def delivery_counts(self, *, now: float) -> dict[str, int]:
        """Pending deliveries by state: ``due``, ``scheduled_retry``, ``held``."""
        rows = await self.dialect.read("delivery_counts", now, gauges=True)
        due, scheduled, held = (int(v) for v in rows[0])
        return {"due": due, "scheduled_retry": scheduled, "held": held}

    async def count_replay(self, source: str, requeued: int) -> None:
        """Count one replay asked for by ``source`` that re-queued ``requeued`` deliveries
        (kept in the database: a CLI replay moves the daemons' metrics too)."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "count_replay", source, requeued)

    async def replay_counts(self) -> dict[str, tuple[int, int]]:
        """Source -> (replays, deliveries they re-queued), as :meth:`count_replay` kept them."""
        counts: dict[str, list[int]] = {}
        for key, value in await self.dialect.read("replay_counts", gauges=True):
            kind, _, source = str(key).partition(":")
            pair = counts.setdefault(source, [0, 0])
            pair[0 if kind == "replays" else 1] = int(value)
        return {source: (runs, requeued) for source, (runs, requeued) in counts.items()}

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

    # --- destinations -----------------------------------------------------
    async def destinations_version(self) -> int:
        """A counter bumped by every change to any destination."""
        return int((await self.dialect.read("destinations_version"))[0][0])

    async def failing_count(self) -> int:
        """Live destinations in a failing episode (``herald.destination.failing``)."""
        return int((await self.dialect.read("failing_count", gauges=True))[0][0])

    async def destination_counts(self) -> list[tuple[str, str, int]]:
        """(type, status, count) of live destinations."""
        rows = await self.dialect.read("destination_counts", gauges=True)
        return [(str(t), str(s), int(n)) for t, s, n in rows]

    async def all_destinations(self) -> list[Destination]:
        """Every destination that is not deleted (for the fan-out index)."""
        rows = await self.dialect.read("all_destinations")
        return [destination_from_row(r, self._box) for r in rows]

    async def create_destination(
        self, dest: Destination, *, verification: tuple[Event, NewDelivery] | None
    ) -> None:
        row = destination_to_row(dest, self._box)
        async with self.dialect.tx() as c:
            await self.dialect.execute(c, "create_destination", *row)
            if verification is not None:
                await self._insert_events(c, [verification[0]], dest.created_at)
                await self._insert_deliveries(c, [verification[1]], dest.created_at)
            await self.dialect.execute(c, "bump_version")

    async def update_destination(
        self,
        dest: Destination,
        *,
        verification: tuple[Event, NewDelivery] | None = None,
        expected_updated_at: float | None = None,
    ) -> bool:
        """Write every field of ``dest``; hold or release its deliveries to match
        its status; a new verification supersedes a pending one.

        With ``expected_updated_at``, write only if the stored row still has that
        ``updated_at`` (optimistic concurrency); returns whether it wrote."""
        d = self.dialect
        row = destination_to_row(dest, self._box)
        async with d.tx() as c:
            written = await d.execute(
                c, "update_destination", *row[2:8], row[9], row[0], expected_updated_at
            )
            if not written:
                return False
            await self._set_held(c, dest.id, held=dest.status != DestinationStatus.ACTIVE)
            if verification is not None:
                await d.execute(c, "fail_verifications", dest.updated_at, dest.id)
                await d.execute(c, "clear_verification_failure", dest.id)
                await self._insert_events(c, [verification[0]], dest.updated_at)
                await self._insert_deliveries(c, [verification[1]], dest.updated_at)
            await d.execute(c, "bump_version")
            return True

    async def get_destination(self, tenant_id: str | None, dest_id: str) -> Destination | None:
        """A destination by id (deleted ones too), scoped to a tenant unless None."""
        rows = await self.dialect.read("get_destination", dest_id, tenant_id)
        return destination_from_row(rows[0], self._box) if rows else None

    async def list_destinations(
        self,
        *,
        tenant_id: str | None,
        status: DestinationStatus | None,
        type: str | None,
        before_id: str | None,
        limit: int,
    ) -> list[Destination]:
        """Live destinations (of one tenant, or of every tenant when None), newest first,
        ids strictly below ``before_id``."""
        rows = await self.dialect.read(
            "list_destinations",
            tenant_id,
            None if status is None else status.value,
            type,
            before_id,
            limit,
        )
        return [destination_from_row(r, self._box) for r in rows]

    async def delete_destination(self, tenant_id: str, dest_id: str, *, now: float) -> bool:
        """Soft-delete; pending deliveries to it end as ``failure``."""
        d = self.dialect
        async with d.tx() as c:
            if not await d.execute(c, "delete_destination", now, dest_id, tenant_id):
                return False
            await d.execute(c, "fail_deliveries_of", now, dest_id)
            await d.execute(c, "bump_version")
            return True

    # --- deliveries and events --------------------------------------------
    async def insert_deliveries(
        self, events: Sequence[Event], deliveries: Sequence[NewDelivery]
    ) -> None:
        async with self.dialect.tx() as c:
            now = time.time()
            await self._insert_events(c, events, now)
            await self._insert_deliveries(c, deliveries, now)

    async def get_delivery(
        self, tenant_id: str | None, delivery_id: str, *, with_attempts: bool
    ) -> Delivery | None:
        rows = await self.dialect.read("get_delivery", delivery_id, tenant_id)
        if not rows:
            return None
        delivery = delivery_from_row(rows[0])
        if not with_attempts:
            return delivery
        attempts = await self.dialect.read("attempts_of", delivery_id)
        return replace(delivery, attempts=tuple(attempt_from_row(a) for a in attempts))

    def _filter_sql(self, flt: DeliveryFilter, params: list[Any]) -> str:
        """``flt`` as SQL conditions on ``herald_deliveries d``, its values appended to
        ``params``: built per call, as any combination of the fields may be set."""
        d = self.dialect
        # (column and operator, value, whether the value is a list of alternatives)
        terms: tuple[tuple[str, Any, bool], ...] = (
            ("d.tenant_id =", flt.tenant_id, False),
            ("d.destination_id =", flt.destination_id, False),
            ("d.status =", None if flt.status is None else flt.status.value, False),
            ("d.event_type", flt.event_types, True),
            ("d.created_at >=", flt.since, False),
            ("d.created_at <", flt.until, False),
            ("d.id", flt.ids, True),
            ("d.kind =", None if flt.kind is None else flt.kind.value, False),
            ("d.replay_id =", flt.replay_id, False),
            ("d.event_id =", flt.event_id, False),
        )
        clauses: list[str] = []
        for term, value, many in terms:
            if many:
                if value:
                    clauses.append(d.any_of(term, value, params))
            elif value is not None:
                params.append(value)
                clauses.append(f"{term} {d.param(len(params))}")
        return " AND ".join(clauses) or "1 = 1"

    async def list_deliveries(
        self, flt: DeliveryFilter, *, before_id: str | None, limit: int
    ) -> list[Delivery]:
        """Deliveries matching ``flt``, newest first, ids strictly below ``before_id``."""
        params: list[Any] = []
        where = self._filter_sql(flt, params)
        if before_id is not None:
            params.append(before_id)
            where += f" AND d.id < {self.dialect.param(len(params))}"
        params.append(limit)
        limit_arg = self.dialect.param(len(params))
        rows = await self.dialect.read(
            "list_deliveries", *params, parts={"where": where, "limit": limit_arg}
        )
        return [delivery_from_row(r) for r in rows]

    async def count_deliveries(self, flt: DeliveryFilter) -> int:
        params: list[Any] = []
        where = self._filter_sql(flt, params)
        rows = await self.dialect.read("count_deliveries", *params, parts={"where": where})
        return int(rows[0][0])

    async def requeue(self, ids: Sequence[str], *, now: float, replay_id: str | None = None) -> int:
        """Finished deliveries start a fresh round of attempts (its start, their attempt
        count, is stored in ``max_attempts``; the daemon's config decides its budget);
        pending ones become due now. Deliveries of deleted destinations and test pings
        are left alone. With ``replay_id``, those re-queued carry it from now on (the
        latest replay owns a delivery); without, they keep the one they carry."""
        if not ids:
            return 0
        async with self.dialect.tx() as c:
            return await self.dialect.execute(c, "requeue", 0, now, replay_id, list(ids))

    # --- replays ----------------------------------------------------------
    async def create_replay(self, replay: Replay) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "create_replay", *replay_to_row(replay))

    async def update_replay(
        self, replay_id: str, *, requeued: int, finished_at: float | None
    ) -> None:
        """Record a running replay's progress, and its end with ``finished_at``."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "update_replay", requeued, finished_at, replay_id)

    async def _with_outcomes(self, rows: Sequence[Sequence[Any]]) -> list[Replay]:
        if not rows:
            return []
        found = await self.dialect.read("replay_outcomes", [r[0] for r in rows])
        outcomes = replay_outcomes(found)
        return [replay_from_row(r, outcomes.get(r[0], ReplayOutcome())) for r in rows]

    async def get_replay(self, tenant_id: str | None, replay_id: str) -> Replay | None:
        """A replay with its outcome counted, scoped to a tenant unless None."""
        rows = await self.dialect.read("get_replay", replay_id, tenant_id)
        replays = await self._with_outcomes(rows)
        return replays[0] if replays else None

    async def list_replays(
        self, *, tenant_id: str | None, before_id: str | None, limit: int
    ) -> list[Replay]:
        """Replays newest first, ids strictly below ``before_id``; every tenant's when
        ``tenant_id`` is None."""
        rows = await self.dialect.read("list_replays", tenant_id, before_id, limit)
        return await self._with_outcomes(rows)

    # --- session tokens ---------------------------------------------------
    async def create_token(
        self,
        *,
        id: str,
        tenant_id: str,
        token_hash: str,
        key_hash: str,
        now: float,
        expires_at: float,
    ) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(
                c, "create_token", id, tenant_id, token_hash, key_hash, now, expires_at
            )

    async def use_token(
        self,
        how: Literal["token", "trade", "session"],
        digest: str,
        *,
        now: float,
        idle: float,
        lifetime: float,
        session_hash: str | None = None,
    ) -> TokenRow | None:
        """Open a live token in one statement and slide its expiry (``now + idle``, never
        past ``created_at + lifetime``): by the token's hash (``token``); the same, once,
        storing ``session_hash`` (``trade``); or by a session's hash (``session``).
        None when it does not open."""
        d = self.dialect
        args = (digest, now, idle, lifetime)
        async with d.tx(atomic=False) as c:
            if how == "trade":
                row = await d.fetchrow(c, "trade_token", *args, session_hash)
            elif how == "session":
                row = await d.fetchrow(c, "open_session", *args)
            else:
                row = await d.fetchrow(c, "open_token", *args)
        return None if row is None else TokenRow(*row)

    async def token_state(self, digest: str, *, session: bool) -> TokenState | None:
        """Why a token (or with ``session``, a portal session) did not open: its row's
        state; None if there is none."""
        if session:
            rows = await self.dialect.read("session_state", digest)
        else:
            rows = await self.dialect.read("token_state", digest)
        return TokenState(*rows[0]) if rows else None

    async def reissue_token(
        self, *, tenant_id: str, token_id: str, token_hash: str, now: float
    ) -> TokenRow | None:
        """Give a live, untraded token a new value (hash); None if it is not one."""
        async with self.dialect.tx(atomic=False) as c:
            row = await self.dialect.fetchrow(
                c, "reissue_token", token_hash, token_id, tenant_id, now
            )
        return None if row is None else TokenRow(*row)

    async def close_session(self, session_hash: str, *, now: float) -> bool:
        async with self.dialect.tx(atomic=False) as c:
            return bool(await self.dialect.execute(c, "close_session", session_hash, now))

    async def get_event(self, tenant_id: str | None, event_id: str) -> Event | None:
        rows = await self.dialect.read("get_event", event_id, tenant_id)
        return event_from_row(rows[0]) if rows else None

    # --- API rate limit ---------------------------------------------------
    async def count_request(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        """Count one request of ``tenant_id`` in fixed window ``window_no``; the window's
        count so far, this one included. ``expire`` also deletes earlier windows."""
        d = self.dialect
        async with d.tx(atomic=False) as c:
            if expire:
                await d.execute(c, "expire_rate_windows", window_no)
            return int(await d.fetchval(c, "count_request", tenant_id, window_no))

    # --- idempotency ------------------------------------------------------
    async def idempotency_begin(
        self, *, tenant_id: str, key: str, fingerprint: str, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        """Reserve ``key``; None when it is new, else the record already there."""
        d = self.dialect
        async with d.tx() as c:
            await d.execute(c, "idempotency_expire", now - ttl)
            if await d.fetchval(c, "idempotency_reserve", tenant_id, key, fingerprint, now):
                return None
            row = await d.fetchrow(c, "idempotency_get", tenant_id, key)
        if row is None:  # expired and deleted between the two statements
            return None
        return IdempotencyRecord(row[0], row[1], None if row[2] is None else bytes(row[2]))

    async def idempotency_finish(
        self, *, tenant_id: str, key: str, status: int, body: bytes
    ) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "idempotency_finish", status, body, tenant_id, key)

    async def idempotency_abort(self, *, tenant_id: str, key: str) -> None:
        """Forget a reservation whose request failed, so the client may retry."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "idempotency_abort", tenant_id, key)

    async def purge(self, *, before: float, limit: int) -> int:
        """Delete up to ``limit`` finished deliveries last changed before ``before``,
        with their attempts, then events and rejected rows left without a use, and
        session tokens expired and replays made before it; returns how many
        deliveries went."""
        d = self.dialect
        async with d.tx() as c:
            ids = [r[0] for r in await d.fetch(c, "purge_select", before, limit)]
            if ids:
                await d.execute(c, "purge_attempts", ids)
            await d.purge_deliveries(c, ids, before=before, limit=limit)
            await d.execute(c, "purge_rejected", before, limit)
            await d.execute(c, "purge_tokens", before, limit)
            await d.execute(c, "purge_replays", before, limit)
            return len(ids)

    # --- API keys ---------------------------------------------------------
    async def create_api_key(
        self, *, key_hash: str, tenant_id: str, hint: str, now: float, kind: str = "tenant"
    ) -> None:
        """Store a key's hash: ``kind`` ``tenant`` for the API, ``operator`` for the console."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "create_api_key", key_hash, tenant_id, hint, now, kind)

    async def tenant_for_key(self, key_hash: str) -> str | None:
        """The tenant of an unrevoked tenant key (never an operator key)."""
        rows = await self.dialect.read("tenant_for_key", key_hash)
        return str(rows[0][0]) if rows else None

    async def list_api_keys(self, tenant_id: str, *, kind: str = "tenant") -> list[ApiKeyInfo]:
        """The tenant's keys of ``kind``, newest first, revoked ones included."""
        rows = await self.dialect.read("list_api_keys", tenant_id, kind)
        return [ApiKeyInfo(*row) for row in rows]

    async def revoke_api_keys(
        self, *, tenant_id: str, hash_prefix: str, now: float, kind: str = "tenant"
    ) -> int:
        """Revoke the tenant's unrevoked keys of ``kind`` whose hash starts with ``hash_prefix``."""
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.execute(
                c, "revoke_api_keys", now, tenant_id, len(hash_prefix), hash_prefix, kind
            )

    async def operator_key_hint(self, key_hash: str) -> str | None:
        """The last characters of an unrevoked operator key, or None: no such key."""
        rows = await self.dialect.read("operator_key", key_hash)
        return str(rows[0][0]) if rows else None

    # --- console sessions -------------------------------------------------
    async def create_console_session(
        self, *, id_hash: str, key_hash: str, now: float, idle_before: float, born_before: float
    ) -> None:
        """Store a new session, and forget those idle since ``idle_before`` or older
        than ``born_before`` (sign-ins are rare enough to sweep on)."""
        d = self.dialect
        async with d.tx() as c:
            await d.execute(c, "console_sessions_expire", idle_before, born_before)
            await d.execute(c, "console_session_create", id_hash, key_hash, now)

    async def get_console_session(self, id_hash: str) -> ConsoleSession | None:
        """A session whose operator key is still unrevoked; expiry is the caller's rule."""
        rows = await self.dialect.read("console_session_get", id_hash)
        return ConsoleSession(str(rows[0][0]), rows[0][1], rows[0][2]) if rows else None

    async def touch_console_session(self, id_hash: str, *, now: float) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "console_session_touch", now, id_hash)

    async def delete_console_session(self, id_hash: str) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "console_session_delete", id_hash)

    async def outcome_counts(
        self, *, since: float, bucket_seconds: int
    ) -> list[tuple[str, int, int]]:
        """Finished deliveries since ``since``: (status, bucket number, count) per bucket
        of ``bucket_seconds`` (bucket number × bucket_seconds is the bucket's start)."""
        rows = await self.dialect.read("console_outcomes", since, float(bucket_seconds))
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]

    async def failing_destinations(self, *, since: float, limit: int) -> list[tuple[str, int]]:
        """(destination id, failed deliveries since ``since``), the most failing first."""
        rows = await self.dialect.read("console_failing", since, limit)
        return [(str(r[0]), int(r[1])) for r in rows]

    async def count_rejected(self, *, up_to: int) -> int:
        """Rejected outbox rows, counted up to ``up_to``."""
        return int((await self.dialect.read("console_rejected_count", up_to))[0][0])

    async def in_flight(self) -> int:
        """Deliveries leased right now (being attempted, or about to be)."""
        return int((await self.dialect.read("console_in_flight"))[0][0])

    # --- key rotation -----------------------------------------------------
    async def reencrypt_secrets(
        self, *, after_id: str | None, limit: int
    ) -> tuple[int, int, str | None]:
        """Re-encrypt under the store's current key, in one transaction, the credentials
        of up to ``limit`` destinations (deleted ones too) with ids above ``after_id``.

        Rows already under the current key are left as they are. Returns the rows looked
        at, the rows rewritten, and the last id looked at (None when none were left).
        Raises CryptoError, naming the destination, if no key of the box opens a row."""
        d = self.dialect
        async with d.tx() as c:
            rows = await d.fetch(c, "reencrypt_select", after_id or "", limit)
            changed = reencrypt_rows(rows, self._box)
            if changed:
                await d.executemany(c, "reencrypt_update", changed)
        return len(rows), len(changed), (str(rows[-1][0]) if rows else None)


def check_migrations(known: list[tuple[int, str, str]], done: set[int]) -> None:
    """Refuse a database migrated by a newer Herald than this one."""
    newest = max((v for v, _, _ in known), default=0)
    if done and max(done) > newest:
        raise StorageError(
            f"database schema version {max(done)} is newer than this Herald ({newest});"
            " upgrade Herald"
        )
