"""Events as callers see them: publish one into the outbox (checked against its
tenant's schema, as the relay checks a row), and read them back — one, one with the
deliveries it fanned out to, or a page of the newest.

:class:`EventOperations` is one room of the service (:class:`herald.service.Operations`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from herald.catalog import Catalog
from herald.errors import NotFound, ValidationError
from herald.fields import check_event_types
from herald.ids import new_id
from herald.ingest import (
    event_id_problem,
    ordering_key_problem,
    reserved_type_problem,
    traceparent_problem,
)
from herald.match import validate_event_type
from herald.model import Delivery, Event
from herald.store import Store
from herald.store.recent import EventsPage, EventSummary
from herald.timeutil import format_epoch, parse_timestamp

log = structlog.get_logger("herald.service")

EVENT_DELIVERIES_MAX = 200
"""An event's page lists at most this many of its deliveries."""


class EventOperations:
    """Publishing and reading events, over the service's store and catalog."""

    store: Store
    catalog: Catalog

    if TYPE_CHECKING:

        def _on_change(self) -> None: ...

    async def publish(
        self,
        tenant_id: str,
        type: str,
        data: Any,
        *,
        event_id: str | None = None,
        created_at: str | None = None,
        traceparent: str | None = None,
        ordering_key: str | None = None,
    ) -> Event:
        """Write one event into the outbox (for producers that cannot write it themselves).
        An invalid ``traceparent`` is dropped with a warning, as the relay drops a row's:
        a broken trace context never costs the event."""
        try:
            validate_event_type(type)
        except ValueError as exc:
            raise ValidationError(str(exc), field="type", code="event_type_invalid") from exc
        if (problem := reserved_type_problem(type)) is not None:
            raise ValidationError(problem, field="type", code="event_type_reserved")
        if not isinstance(data, dict):
            raise ValidationError("data must be a JSON object", field="data", code="data_invalid")
        if ordering_key is not None and (problem := ordering_key_problem(ordering_key)):
            raise ValidationError(problem, field="ordering_key", code="ordering_key_invalid")
        await self._check_schema(tenant_id, type, data)
        if event_id is None:
            event_id = new_id("evt_")
        elif (problem := event_id_problem(event_id)) is not None:
            raise ValidationError(problem, field="id", code="event_id_invalid")
        now = time.time()
        if created_at is None:
            instant_text, instant_ts = format_epoch(now), now
        else:
            try:
                instant = parse_timestamp(created_at)
            except ValueError as exc:
                raise ValidationError(
                    str(exc), field="created_at", code="timestamp_invalid"
                ) from exc
            instant_text, instant_ts = instant.text, instant.epoch
        payload = orjson.dumps(data)
        if traceparent and (problem := traceparent_problem(traceparent)):
            log.warning("traceparent_ignored", event_id=event_id, reason=problem)
            traceparent = None
        await self.store.insert_outbox(
            id=event_id,
            tenant_id=tenant_id,
            type=type,
            data=payload,
            created_at=instant_text,
            traceparent=traceparent or None,
            ordering_key=ordering_key,
        )
        self._on_change()
        return Event(
            event_id,
            tenant_id,
            type,
            instant_text,
            instant_ts,
            payload,
            traceparent or None,
            ordering_key,
        )

    async def _check_schema(self, tenant_id: str, type: str, data: dict[str, Any]) -> None:
        """422 ``schema_mismatch`` naming each place where ``data`` breaks its type's
        schema (at most 20), or ``event_type_unknown`` under
        ``catalog.require_known_types``; the catalog is reloaded first if it changed."""
        await self.catalog.refresh()
        found = self.catalog.violations(tenant_id, type, data)
        if not found:
            return
        if found[0][0] == "type":
            raise ValidationError(found[0][1], field="type", code="event_type_unknown")
        first, *rest = (
            ValidationError(f"{path}: {message}", field=path, code="schema_mismatch")
            for path, message in found
        )
        first.also = tuple(rest)
        raise first

    async def find_event(
        self, tenant_id: str | None, event_id: str
    ) -> tuple[Event, list[Delivery]]:
        """An event (of any tenant when ``tenant_id`` is None) and the deliveries it
        fanned out to, newest first."""
        event = await self.store.get_event(tenant_id, event_id)
        if event is None and tenant_id is not None:
            return await self.get_event(tenant_id, event_id), []
        if event is None:
            raise NotFound(f"no event {event_id}", code="event_not_found")
        # By (tenant, event id): another tenant that used the same id must not crowd
        # this event's deliveries out of the page.
        found = await self.store.event_deliveries(
            event.tenant_id, event.id, limit=EVENT_DELIVERIES_MAX
        )
        return event, found

    async def rejected_rows(self, *, limit: int = 100) -> list[dict[str, object]]:
        """The newest rows the relay could not turn into events, with their reasons."""
        return await self.store.list_rejected(limit=limit)

    async def get_event(self, tenant_id: str, event_id: str) -> Event:
        event = await self.store.get_event(tenant_id, event_id)
        if event is None:
            # Published but not yet relayed: it exists for the caller already.
            event = await self.store.get_outbox_event(tenant_id, event_id)
        if event is None:
            # The relay moves an event out of the outbox and into the events in one
            # transaction; if it did so between the two reads above, it is there now.
            event = await self.store.get_event(tenant_id, event_id)
        if event is None:
            raise NotFound(f"no event {event_id}", code="event_not_found")
        return event

    async def recent_events(
        self,
        tenant_id: str | None,
        *,
        type: str | None = None,
        since: float | None = None,
        until: float | None = None,
        after: EventsPage | None = None,
        limit: int = 20,
    ) -> tuple[list[EventSummary], bool]:
        """Events newest first (every tenant's when ``tenant_id`` is None), received
        within [``since``, ``until``], of one ``type`` if given, past ``after``; and
        whether there are more."""
        if type is not None:
            check_event_types((type,), field="type")
        rows = await self.store.list_events(
            tenant_id=tenant_id, type=type, since=since, until=until, after=after, limit=limit + 1
        )
        return rows[:limit], len(rows) > limit


__all__ = ["EVENT_DELIVERIES_MAX", "EventOperations", "EventSummary", "EventsPage"]
