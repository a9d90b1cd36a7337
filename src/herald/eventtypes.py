"""The tenants' event-type catalogs (``service.event_types``): put, read, list and
delete entries, each a description and optionally a JSON Schema (2020-12) that
every payload of the type must match (enforced by :mod:`herald.catalog` at publish
and in the relay). Herald's own types (``herald.…``) are in every tenant's catalog,
described by :data:`herald.eventschema.OPERATIONAL_CATALOG`, and cannot be changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from herald.errors import BadRequest, NotFound, ValidationError
from herald.eventschema import OPERATIONAL_CATALOG, check_schema, schema_text
from herald.match import validate_event_type
from herald.model import OPERATIONAL_PREFIX, EventType
from herald.store import Store

MAX_DESCRIPTION = 2000
"""Characters of an event type's description."""


def _builtin(tenant_id: str, event_type: str) -> EventType:
    description, schema = OPERATIONAL_CATALOG[event_type]
    return EventType(tenant_id, event_type, description, schema, 0.0, 0.0, builtin=True)


def checked_type(event_type: str) -> str:
    """``event_type`` if it names an event type; 422 ``event_type_invalid`` otherwise."""
    try:
        return validate_event_type(event_type)
    except ValueError as exc:
        raise ValidationError(str(exc), field="type", code="event_type_invalid") from None


class EventTypes:
    """One tenant's catalog at a time, as the API, the CLI and the faces ask."""

    def __init__(self, store: Store, *, on_change: Callable[[], None] = lambda: None) -> None:
        self._store = store
        self._on_change = on_change

    async def put(self, tenant_id: str, event_type: str, body: Mapping[str, Any]) -> EventType:
        """Create or replace the entry of ``event_type``: ``description`` (text) and
        ``schema`` (a JSON Schema object, or null/absent for any payload)."""
        checked_type(event_type)
        if event_type.startswith(OPERATIONAL_PREFIX):
            raise ValidationError(
                f"{event_type} is Herald's own event type; its entry cannot change",
                field="type",
                code="event_type_reserved",
            )
        for key in body:
            if key not in ("description", "schema"):
                raise BadRequest(f"unknown field {key!r}", field=key, code="unknown_field")
        description = body.get("description") or ""
        if not isinstance(description, str):
            raise BadRequest("description must be a string", field="description")
        if len(description) > MAX_DESCRIPTION:
            raise ValidationError(
                f"description is at most {MAX_DESCRIPTION} characters", field="description"
            )
        schema = body.get("schema")
        text = None if schema is None else schema_text(check_schema(schema))
        entry = await self._store.put_event_type(
            tenant_id, event_type, description, text, now=time.time()
        )
        self._on_change()
        return entry

    async def get(self, tenant_id: str, event_type: str) -> EventType:
        """An entry; 404 for a name that is not one (no entry can have it)."""
        try:
            checked_type(event_type)
        except ValidationError:
            raise NotFound("no such event type", code="event_type_not_found") from None
        if event_type in OPERATIONAL_CATALOG:
            return _builtin(tenant_id, event_type)
        entry = await self._store.get_event_type(tenant_id, event_type)
        if entry is None:
            raise NotFound(f"no event type {event_type}", code="event_type_not_found")
        return entry

    async def list(
        self, tenant_id: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[EventType], bool]:
        """A page of the tenant's catalog in type order (Herald's own types among
        them), types after ``after``; and whether more follow."""
        after = after or ""
        stored = await self._store.list_event_types(tenant_id, after=after, limit=limit + 1)
        builtins = [_builtin(tenant_id, t) for t in sorted(OPERATIONAL_CATALOG) if t > after]
        merged = sorted([*stored, *builtins], key=lambda e: e.type)[: limit + 1]
        return merged[:limit], len(merged) > limit

    async def delete(self, tenant_id: str, event_type: str) -> EventType:
        entry = await self.get(tenant_id, event_type)
        if entry.builtin:
            raise ValidationError(
                f"{event_type} is Herald's own event type; its entry cannot be deleted",
                field="type",
                code="event_type_reserved",
            )
        if not await self._store.delete_event_type(tenant_id, event_type):
            raise NotFound(f"no event type {event_type}", code="event_type_not_found")
        self._on_change()
        return entry
