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

from herald.crypto import SecretBox
from herald.flow import Flow
from herald.model import Event, NewDelivery, RelayPlan
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
