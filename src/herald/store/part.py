"""What every part of the store stands on: the dialect, and the writes that more
than one part makes (an event and its deliveries, a destination's hold).

The store (:class:`~herald.store.sqlstore.SQLStore`) is one object made of parts,
each a mixin with one job over the same dialect: :mod:`~herald.store.engine`,
:mod:`~herald.store.destinations`, :mod:`~herald.store.history` and
:mod:`~herald.store.access`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from herald.crypto import SecretBox
from herald.flow import Flow
from herald.model import DeliveryKind, Event, NewDelivery, RelayPlan
from herald.ordering import Key, heads, take
from herald.store.dialect import Conn, Dialect, Row
from herald.store.rows import flow_from_row, flow_to_row, new_delivery_rows


class StorePart:
    """The base of every part of the store: the dialect its statements run on."""

    dialect: Dialect
    _box: SecretBox
    """Seals credentials, and marks the operational events Herald writes into its outbox."""

    async def _read_for(
        self, every: str, one: str, tenant_id: str | None, *args: Any, gauges: bool = False
    ) -> list[Row]:
        """Query ``every`` (every tenant's rows), or ``one`` for one tenant (its id the
        last argument): the console's counts, and the portal's of one tenant."""
        if tenant_id is None:
            return await self.dialect.read(every, *args, gauges=gauges)
        return await self.dialect.read(one, *args, tenant_id, gauges=gauges)

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
                    e.ordering_key,
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
        found = await self.dialect.fetch(c, "destination_statuses", dest_ids)
        statuses: dict[str, str] = {r[0]: r[1] for r in found}
        # The committed ordering, as the status: a catalog a moment old must not order
        # deliveries for a destination no longer ordered (none would release them).
        keyed = {r[0] for r in found if r[2] == "key"}
        flowed = {r[0] for r in found if r[3]}
        ordered = await self._order(
            c,
            [
                d
                for d in rows
                if d.ordering_key is not None
                and d.kind is DeliveryKind.EVENT
                and d.destination_id in keyed
            ],
        )
        values, leased = new_delivery_rows(rows, statuses, now, ordered, flowed)
        await self.dialect.insert_many(c, "insert_deliveries", values)
        for d in rows:  # the plan says what was stored (herald.handover reads it)
            order = ordered.get(d.id)
            if order is None:
                d.ordering_key = None
            elif order[1]:
                d.held, d.lease_owner = True, None
        return leased

    async def _order(self, c: Conn, rows: Sequence[NewDelivery]) -> dict[str, tuple[int, bool]]:
        """Inside the write of new deliveries of ordered keys (``rows``, in the relay's
        order): each one's ``order_seq`` and whether it waits behind its key's head
        (``herald.ordering``), decided under the keys' locks, after the destinations'."""
        if not rows:
            return {}
        d = self.dialect
        keys: list[Key] = [(r.destination_id, str(r.ordering_key)) for r in rows]
        pairs = orjson.dumps(sorted(set(keys))).decode()
        await d.fetch(c, "keys_lock", pairs)
        busy = {(str(r[0]), str(r[1])) for r in await d.fetch(c, "keys_busy", pairs)}
        top = int(await d.fetchval(c, "order_take", len(rows)))
        seqs = take(top - len(rows) + 1, keys)
        first = heads(keys, busy)
        return {
            r.id: (int(seq or 0), not head) for r, seq, head in zip(rows, seqs, first, strict=True)
        }

    async def _relay_fence(
        self, c: Conn, *, ordered: bool, destinations_version: int | None
    ) -> bool:
        """A relay pass's first steps in its transaction ``c``: the order lock when some
        destination is ordered (passes on several instances number their deliveries one
        after the other), then whether the caller's catalog is still current (False:
        destinations changed since ``destinations_version``; write nothing)."""
        d = self.dialect
        if ordered:
            await d.fetch(c, "order_lock")
        if destinations_version is None:
            return True
        return int(await d.fetchval(c, "destinations_version")) == destinations_version

    async def _write_plan(self, c: Conn, plan: RelayPlan, now: float, source: str) -> None:
        """Store what the relay planned for a batch of outbox rows: the events, their
        deliveries (``plan.leased`` set to those stored leased) and the rejected rows,
        named by the ``source`` they came from (``herald``: the built-in outbox)."""
        await self._insert_events(c, plan.events, now)
        plan.leased = await self._insert_deliveries(c, plan.deliveries, now)
        if plan.rejected:
            await self.dialect.executemany(
                c,
                "relay_reject",
                [
                    (r.seq, r.id, r.tenant_id, r.type, r.data, r.created_at, r.reason, now, source)
                    for r in plan.rejected
                ],
            )

    async def _set_held(self, c: Conn, dest_id: str, *, held: bool) -> None:
        await self.dialect.execute(c, "set_held", int(held), dest_id, int(not held))

    async def _lock_flows(
        self, c: Conn, ids: Iterable[str], *, breakers: bool = False
    ) -> dict[str, Flow]:
        """The ``herald_flow`` rows of ``ids`` (with ``breakers``, only those whose
        breaker is on), locked in id order (after every delivery row the transaction
        holds)."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        d = self.dialect
        if breakers:
            rows = await d.fetch(c, "breaker_lock", wanted)
        else:
            rows = await d.fetch(c, "flow_lock", wanted)
        return {f.destination_id: f for f in map(flow_from_row, rows)}

    async def _write_flows(self, c: Conn, flows: Iterable[Flow]) -> None:
        rows = [flow_to_row(f) for f in flows]
        if rows:
            await self.dialect.executemany(c, "set_flow", rows)
