"""The store's part that holds the tenants' event-type catalogs: one row per tenant
and type, its description and JSON Schema. A change bumps the destinations version,
so every process's catalog (:mod:`herald.catalog`) reloads the schemas it enforces."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from herald.model import EventType
from herald.store.part import StorePart


def _event_type(row: Sequence[Any]) -> EventType:
    return EventType(
        tenant_id=row[0],
        type=row[1],
        description=row[2],
        schema=None if row[3] is None else orjson.loads(row[3]),
        created_at=row[4],
        updated_at=row[5],
    )


class EventTypeStore(StorePart):
    """Event types: put, read, listed in type order, deleted."""

    async def put_event_type(
        self, tenant_id: str, type: str, description: str, schema: str | None, *, now: float
    ) -> EventType:
        """Create or replace one entry (``schema`` as compact JSON text); returns it."""
        d = self.dialect
        async with d.tx() as c:
            await d.execute(c, "put_event_type", tenant_id, type, description, schema, now)
            await d.execute(c, "bump_version")
            rows = await d.fetch(c, "get_event_type", tenant_id, type)
        return _event_type(rows[0])

    async def get_event_type(self, tenant_id: str, type: str) -> EventType | None:
        rows = await self.dialect.read("get_event_type", tenant_id, type)
        return _event_type(rows[0]) if rows else None

    async def list_event_types(self, tenant_id: str, *, after: str, limit: int) -> list[EventType]:
        """The tenant's entries with types after ``after``, in type order."""
        rows = await self.dialect.read("list_event_types", tenant_id, after, limit)
        return [_event_type(r) for r in rows]

    async def all_event_types(self) -> list[EventType]:
        """Every tenant's entries (for the catalog's schemas)."""
        return [_event_type(r) for r in await self.dialect.read("all_event_types")]

    async def delete_event_type(self, tenant_id: str, type: str) -> bool:
        d = self.dialect
        async with d.tx() as c:
            if not await d.execute(c, "delete_event_type", tenant_id, type):
                return False
            await d.execute(c, "bump_version")
            return True
