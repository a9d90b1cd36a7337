"""The store's part that keeps the record people look back at: deliveries with their
attempts, events, rejected outbox rows, replays (and the re-queue they make), the
console's counts, and the retention purge that ends it all."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson

from herald.ingest import Reject, parse_row
from herald.model import (
    BlockedKey,
    Delivery,
    DeliveryFilter,
    Event,
    NewDelivery,
    OutboxRow,
    Replay,
    ReplayOutcome,
)
from herald.ordering import Requeued, heads, requeue_order, take
from herald.store.counters import purge_hours
from herald.store.part import StorePart
from herald.store.rows import (
    attempt_from_row,
    delivery_from_row,
    event_from_row,
    replay_from_row,
    replay_outcomes,
    replay_to_row,
)

_REJECTED_KEYS = (
    "seq",
    "id",
    "tenant_id",
    "type",
    "data",
    "created_at",
    "reason",
    "rejected_at",
    "source",
)


class HistoryStore(StorePart):
    """Deliveries, events, rejected rows and replays: read, re-queued, counted, purged."""

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

    async def event_deliveries(
        self, tenant_id: str, event_id: str, *, limit: int
    ) -> list[Delivery]:
        """The deliveries of the tenant's event ``event_id``, newest first."""
        rows = await self.dialect.read("event_deliveries", tenant_id, event_id, limit)
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
        d = self.dialect
        async with d.tx() as c:
            keyed = await d.fetch(c, "requeue_keys", list(ids))
            if not keyed:
                return await d.execute(c, "requeue", 0, now, replay_id, list(ids))
            # Ordered keys (herald.ordering): re-queued in their first order, at the end
            # of what each key has pending, under the order lock and the keys' locks.
            await d.fetch(c, "order_lock")
            pairs = {(str(r[1]), str(r[4])) for r in keyed if r[4] is not None}
            pairs |= {(str(r[1]), str(r[5])) for r in keyed if r[5] is not None}
            await d.fetch(c, "keys_lock", orjson.dumps(sorted(pairs)).decode())
            rows = [
                Requeued(
                    str(r[0]),
                    None if r[5] is None else (str(r[1]), str(r[5])),
                    None if r[3] is None else int(r[3]),
                    bool(r[2]),
                )
                for r in await d.fetch(c, "requeue_keys", list(ids))
            ]
            joining = requeue_order(rows)
            wanted = sorted({r.key for r in joining if r.key is not None})
            busy: set[tuple[str, str]] = set()
            if wanted:
                found = await d.fetch(c, "keys_busy", orjson.dumps(wanted).decode())
                busy = {(str(r[0]), str(r[1])) for r in found}
            count = await d.execute(c, "requeue", 0, now, replay_id, list(ids))
            if joining:
                keys = [r.key for r in joining]
                top = int(await d.fetchval(c, "order_take", len(joining)))
                seqs = take(top - len(joining) + 1, keys)
                await d.executemany(
                    c,
                    "requeue_ordered",
                    [
                        (r.key[1] if r.key else None, seq, int(not head), r.id)
                        for r, seq, head in zip(joining, seqs, heads(keys, busy), strict=True)
                    ],
                )
            return count

    async def blocked_keys(self, destination_id: str, *, limit: int) -> list[BlockedKey]:
        """An ordered destination's keys whose next delivery waits, each with the
        delivery at its head (the one it waits for), the soonest due first."""
        rows = await self.dialect.read("blocked_keys", destination_id, limit)
        return [
            BlockedKey(str(r[0]), str(r[1]), int(r[3]), r[4], bool(r[5]), int(r[6])) for r in rows
        ]

    async def get_event(self, tenant_id: str | None, event_id: str) -> Event | None:
        rows = await self.dialect.read("get_event", event_id, tenant_id)
        return event_from_row(rows[0]) if rows else None

    async def get_outbox_event(self, tenant_id: str, event_id: str) -> Event | None:
        """An event still waiting in the outbox, if it parses (for GET right after publish)."""
        rows = await self.dialect.read("outbox_event", event_id, tenant_id)
        if not rows:
            return None
        try:
            return parse_row(OutboxRow(*rows[0]), max_payload_bytes=1 << 62, marks=self._box)
        except Reject:
            return None

    async def recent_events(self, tenant_id: str, *, limit: int) -> list[Event]:
        """The tenant's newest stored events, newest first."""
        rows = await self.dialect.read("recent_events", tenant_id, limit)
        return [event_from_row(r) for r in rows]

    # --- rejected outbox rows ---------------------------------------------
    async def list_rejected(
        self, *, limit: int, tenant_id: str | None = None
    ) -> list[dict[str, object]]:
        """Rejected outbox rows, newest first: one tenant's, or (None) every tenant's."""
        rows = await self.dialect.read("list_rejected", limit, tenant_id)
        return [dict(zip(_REJECTED_KEYS, row, strict=True)) for row in rows]

    async def count_rejected(self, *, up_to: int) -> int:
        """Rejected outbox rows, counted up to ``up_to``."""
        return int((await self.dialect.read("console_rejected_count", up_to))[0][0])

    # --- replays ----------------------------------------------------------
    async def create_replay(self, replay: Replay) -> None:
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(c, "create_replay", *replay_to_row(replay))

    async def update_replay(
        self, replay_id: str, *, requeued: int, finished_at: float | None, cut_short: bool = False
    ) -> None:
        """Record a running replay's progress, and its end with ``finished_at`` (with
        ``cut_short``, an end before it had re-queued everything)."""
        async with self.dialect.tx(atomic=False) as c:
            await self.dialect.execute(
                c, "update_replay", requeued, finished_at, replay_id, cut_short
            )

    async def end_unfinished_replays(self, *, now: float) -> int:
        """End every replay still marked running, cut short at ``now``: for a database
        only this process uses (SQLite), whose previous run left them."""
        async with self.dialect.tx(atomic=False) as c:
            return await self.dialect.execute(c, "end_unfinished_replays", now, True)

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

    # --- the console's counts ---------------------------------------------
    async def outcome_counts(
        self, *, since: float, bucket_seconds: int, tenant_id: str | None = None
    ) -> list[tuple[str, int, int]]:
        """Finished deliveries since ``since``: (status, bucket number, count) per bucket
        of ``bucket_seconds`` (bucket number × bucket_seconds is the bucket's start); of
        ``tenant_id``'s destinations when given."""
        rows = await self._read_for(
            "console_outcomes", "tenant_outcomes", tenant_id, since, float(bucket_seconds)
        )
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]

    async def failing_destinations(
        self, *, since: float, limit: int, tenant_id: str | None = None
    ) -> list[tuple[str, int]]:
        """(destination id, failed deliveries since ``since``), the most failing first."""
        rows = await self._read_for("console_failing", "tenant_failing", tenant_id, since, limit)
        return [(str(r[0]), int(r[1])) for r in rows]

    async def in_flight(self, *, tenant_id: str | None = None) -> int:
        """Deliveries leased right now (being attempted, or about to be)."""
        rows = await self._read_for("console_in_flight", "tenant_in_flight", tenant_id)
        return int(rows[0][0])

    # --- retention --------------------------------------------------------
    async def purge(self, *, before: float, limit: int) -> int:
        """Delete up to ``limit`` finished deliveries last changed before ``before``,
        with their attempts, then events and rejected rows left without a use, and
        session tokens expired, replays made and destination counters' hours ended
        before it; returns how many deliveries went."""
        d = self.dialect
        async with d.tx() as c:
            ids = [r[0] for r in await d.fetch(c, "purge_select", before, limit)]
            if ids:
                await d.execute(c, "purge_attempts", ids)
            await d.purge_deliveries(c, ids, before=before, limit=limit)
            await d.execute(c, "purge_rejected", before, limit)
            await d.execute(c, "purge_tokens", before, limit)
            await d.execute(c, "purge_replays", before, limit)
            await purge_hours(d, c, before=before, limit=limit)
            return len(ids)
