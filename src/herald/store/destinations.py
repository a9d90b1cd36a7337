"""The store's part that holds the destinations: their rows (credentials sealed with
the store's key box), the version that tells a catalog to reload, their counts, and
the re-encryption of their credentials under a new key."""

from __future__ import annotations

from herald.crypto import SecretBox
from herald.flow import Flow, configured
from herald.model import Destination, DestinationStatus, Event, NewDelivery
from herald.store.dialect import Conn
from herald.store.part import StorePart
from herald.store.rows import destination_from_row, destination_to_row, reencrypt_rows


class DestinationStore(StorePart):
    """Destinations: created, changed, read, deleted, counted, re-encrypted."""

    _box: SecretBox
    """Seals and opens the credentials in a destination's row."""

    # --- destinations -----------------------------------------------------
    async def destinations_version(self) -> int:
        """A counter bumped by every change to any destination."""
        return int((await self.dialect.read("destinations_version"))[0][0])

    async def failing_count(self) -> int:
        """Live destinations in a failing episode (``herald.destination.failing``)."""
        return int((await self.dialect.read("failing_count", gauges=True))[0][0])

    async def open_circuits(self) -> list[str]:
        """Live destinations whose circuit is open or probing (herald.flow)."""
        return [str(r[0]) for r in await self.dialect.read("open_circuits", gauges=True)]

    async def destination_counts(self) -> list[tuple[str, str, int]]:
        """(type, status, count) of live destinations."""
        rows = await self.dialect.read("destination_counts", gauges=True)
        return [(str(t), str(s), int(n)) for t, s, n in rows]

    async def tenant_destination_count(self, tenant_id: str) -> int:
        """How many destinations ``tenant_id`` has that are not deleted."""
        return int((await self.dialect.read("tenant_destination_count", tenant_id))[0][0])

    async def all_destinations(self) -> list[Destination]:
        """Every destination that is not deleted (for the fan-out index)."""
        rows = await self.dialect.read("all_destinations")
        return [destination_from_row(r, self._box) for r in rows]

    async def create_destination(
        self, dest: Destination, *, verification: tuple[Event, NewDelivery] | None
    ) -> None:
        row = destination_to_row(dest, self._box)
        async with self.dialect.tx() as c:
            await self.dialect.execute(c, "create_destination", *row[:11])
            if row[11] is not None:
                await self.dialect.execute(c, "set_destination_filter", row[11], dest.id)
            if dest.ordering != "none":
                await self.dialect.execute(c, "set_destination_ordering", dest.ordering, dest.id)
            if dest.rate_limit_per_second is not None or dest.circuit_breaker:
                flow = Flow(dest.id)
                configured(flow, dest.rate_limit_per_second, dest.circuit_breaker, dest.created_at)
                await self._write_flows(c, [flow])
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
                c,
                "update_destination",
                *row[2:8],
                row[9],
                row[0],
                expected_updated_at,
                row[11],
                row[12],
            )
            if not written:
                return False
            if dest.ordering == "none":
                # Its deliveries waiting behind a key's head flow now (docs/ordering.md).
                await d.execute(c, "unorder_deliveries", dest.id)
            await self._set_held(c, dest.id, held=dest.status != DestinationStatus.ACTIVE)
            await self._configure_flow(c, dest)
            if verification is not None:
                await d.execute(c, "fail_verifications", dest.updated_at, dest.id)
                await d.execute(c, "clear_verification_failure", dest.id)
                await self._insert_events(c, [verification[0]], dest.updated_at)
                await self._insert_deliveries(c, [verification[1]], dest.updated_at)
            await d.execute(c, "bump_version")
            return True

    async def _configure_flow(self, c: Conn, dest: Destination) -> None:
        """Keep ``dest``'s flow row (herald.flow) to its settings, last: the lock order
        is destination, deliveries, flow."""
        flow = (await self._lock_flows(c, [dest.id])).get(dest.id)
        rate, breaker = dest.rate_limit_per_second, dest.circuit_breaker
        if flow is None:
            if rate is None and not breaker:
                return
            flow = Flow(dest.id)
            # Under flow control from now on (the row stays until the destination is
            # deleted), in its lane.
            await self.dialect.execute(c, "flow_lane", dest.id)
        elif flow.rate == rate and flow.breaker == breaker:
            return
        configured(flow, rate, breaker, dest.updated_at)
        await self._write_flows(c, [flow])

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
        """Soft-delete; pending deliveries to it end as ``failure`` and its flow row
        (herald.flow) goes: no claim has anything left to pace or to probe."""
        d = self.dialect
        async with d.tx() as c:
            if not await d.execute(c, "delete_destination", now, dest_id, tenant_id):
                return False
            await d.execute(c, "fail_deliveries_of", now, dest_id)
            await d.execute(c, "drop_flow", dest_id)
            await d.execute(c, "bump_version")
            return True

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
