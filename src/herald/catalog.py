"""The in-memory view of destinations: lookup by id and the fan-out index; and of
the tenants' event-type catalogs: the schemas the relay and the API enforce.

Rebuilt whenever the store's destinations version moves (an event type's change
moves it too), so changes made by another process (the CLI, another API) reach the
relay and the workers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from herald.adapters.base import Adapter, DestinationConfig
from herald.adapters.registry import Registry
from herald.config import Redactor
from herald.errors import HeraldError
from herald.eventschema import Validator, schema_text, validator_for, violations
from herald.match import SubscriptionIndex
from herald.model import DeliveryKind, Destination, DueDelivery, Event, is_operational
from herald.payload_filter import Filter, compile_filter, document_of
from herald.store import Store

log = structlog.get_logger("herald.catalog")


@dataclass(frozen=True, slots=True)
class Entry:
    dest: Destination
    adapter: Adapter
    config: DestinationConfig | None
    """None when the stored config no longer validates; its deliveries fail loudly."""
    error: str | None = None
    filter: Filter | None = None
    """Its payload filter, compiled; None: every event of its types."""


@dataclass(frozen=True, slots=True)
class _View:
    """What one refresh loaded, published at once: the relay plans a batch in SQLite's
    writer thread (store.sqlitethread) while a refresh may run on the event loop, and
    must never see one load's index beside another's entries."""

    entries: dict[str, Entry]
    index: dict[str, SubscriptionIndex[str]]
    types: dict[tuple[str, str], Validator | None]
    """(tenant, type) of every catalog entry → its compiled schema (None: any data)."""


class Catalog:
    def __init__(
        self, store: Store, registry: Registry, *, require_known_types: bool = False
    ) -> None:
        self._store = store
        self._registry = registry
        self.require_known_types = require_known_types
        """``catalog.require_known_types``: a type outside the tenant's catalog is refused."""
        self._version = -1
        self._view = _View({}, {}, {})
        # One refresh at a time: an older read finishing after a newer one would put
        # stale destinations (say, a secret from before a rotation) back in place.
        self._refreshing = asyncio.Lock()
        self.ordered = False
        """Some destination is ordered (``ordering = "key"``, herald.ordering): the relay
        then takes the order lock first."""

    @property
    def redact(self) -> Redactor:
        """The masking every recorded attempt's error and excerpt goes through."""
        return self._registry.redact

    def rate_limited(self, destination_id: str) -> bool:
        """Whether the destination has a rate limit (as loaded)."""
        entry = self._view.entries.get(destination_id)
        return entry is not None and entry.dest.rate_limit_per_second is not None

    @property
    def version(self) -> int:
        return self._version

    async def refresh(self, *, force: bool = False) -> bool:
        """Reload if anything changed; True when it did."""
        async with self._refreshing:
            return await self._refresh(force=force)

    async def _refresh(self, *, force: bool) -> bool:
        version = await self._store.destinations_version()
        if version == self._version and not force:
            return False
        dests = await self._store.all_destinations()
        entries: dict[str, Entry] = {}
        index: dict[str, SubscriptionIndex[str]] = {}
        for dest in dests:
            old = self._view.entries.get(dest.id)
            if old is not None and old.dest.updated_at == dest.updated_at:
                entry = Entry(dest, old.adapter, old.config, old.error, old.filter)
            else:
                entry = self._entry(dest)
                if old is not None:
                    await old.adapter.forget(dest.id)
            entries[dest.id] = entry
            index.setdefault(dest.tenant_id, SubscriptionIndex()).add(dest.id, dest.events)
        for gone in self._view.entries.keys() - entries.keys():
            await self._view.entries[gone].adapter.forget(gone)
        types = {
            (t.tenant_id, t.type): None
            if t.schema is None
            else validator_for(schema_text(t.schema))
            for t in await self._store.all_event_types()
        }
        self._view = _View(entries, index, types)
        self.ordered = any(e.dest.ordering == "key" for e in entries.values())
        self._version = version
        return True

    def _entry(self, dest: Destination) -> Entry:
        adapter = self._registry.get(dest.type)
        payload_filter = None
        if dest.filter is not None:
            try:
                payload_filter = compile_filter(dest.filter)
            except HeraldError as exc:  # stored before a limit tightened: say so, send all
                log.error("destination_filter_invalid", destination_id=dest.id, error=exc.message)
        raw = {k: v for k, v in dest.config.items() if not k.startswith("_")}
        raw.update({k: v for k, v in dest.secrets.items() if not k.startswith("_")})
        try:
            config = self._registry.parse_config(dest.type, raw)
        except HeraldError as exc:
            log.error("destination_config_invalid", destination_id=dest.id, error=exc.message)
            return Entry(dest, adapter, None, exc.message, payload_filter)
        return Entry(dest, adapter, config, filter=payload_filter)

    def get(self, dest_id: str) -> Entry | None:
        return self._view.entries.get(dest_id)

    def behind(self, item: DueDelivery) -> bool:
        """Whether this view is older than ``item`` needs: its destination is missing
        (created since the last reload), or ``item`` verifies a change not loaded yet.

        A ping that verifies a new target must go to that target: sent to the old one
        from a stale view, it would activate a destination nobody has verified. The
        ping's event is stamped with the change's ``updated_at`` (the service's doing)."""
        entry = self._view.entries.get(item.destination_id)
        if entry is None:
            return True
        return (
            item.kind is DeliveryKind.VERIFICATION and entry.dest.updated_at < item.event.created_ts
        )

    def subscribers(self, tenant_id: str, event_type: str) -> list[Entry]:
        view = self._view
        index = view.index.get(tenant_id)
        if index is None:
            return []
        return [view.entries[d] for d in sorted(index.match(event_type))]

    def violations(self, tenant_id: str, event_type: str, data: Any) -> list[tuple[str, str]]:
        """How ``data`` breaks the schema of the tenant's type: ``(data.<path>, message)``
        each, at most 20; empty when it matches or the type has no schema. A type
        outside the catalog is one violation at ``type`` when
        :attr:`require_known_types` (Herald's own types are always known)."""
        key = (tenant_id, event_type)
        types = self._view.types
        if key not in types:
            if self.require_known_types and not is_operational(event_type):
                return [("type", f"{event_type} is not in the tenant's event-type catalog")]
            return []
        validator = types[key]
        return [] if validator is None else violations(validator, data)

    def refusal(self, event: Event) -> tuple[str, str] | None:
        """Why the relay refuses ``event`` (code, detail), or None: its data breaks its
        type's schema (``schema_mismatch``, the first violation), or its type is unknown
        under ``require_known_types`` (``unknown_type``)."""
        key = (event.tenant_id, event.type)
        types = self._view.types
        validator = types.get(key)
        if validator is None:
            if key in types or not self.require_known_types:
                return None
            problems = self.violations(event.tenant_id, event.type, None)
            return ("unknown_type", problems[0][1]) if problems else None
        found = violations(validator, orjson.loads(event.data), limit=1)
        return ("schema_mismatch", f"{found[0][0]} {found[0][1]}") if found else None

    def fan_out(self, event: Event) -> tuple[list[Entry], list[str]]:
        """The subscribers of ``event`` whose payload filter it passes, and the ids of
        those whose filter it does not (no delivery for them)."""
        wanted: list[Entry] = []
        filtered: list[str] = []
        document = None
        for entry in self.subscribers(event.tenant_id, event.type):
            if entry.filter is not None:
                if document is None:  # parsed once per event, and only when asked
                    document = document_of(event)
                if not entry.filter.matches(document):
                    filtered.append(entry.dest.id)
                    continue
            wanted.append(entry)
        return wanted, filtered

    def __len__(self) -> int:
        return len(self._view.entries)
