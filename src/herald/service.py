"""The service: every operation a caller may ask of Herald's data, shared by the REST
API, the console, the portal and the CLI (:class:`Operations`).

Every rule about what a caller may do lives here once: body validation, state
transitions, secret rotation, retry. Its rooms: the destinations and deliveries here,
events in :mod:`herald.events`, verification and test pings in :mod:`herald.pings`,
replays in :mod:`herald.replays` (``Operations.replays``), the event-type catalogs in
:mod:`herald.eventtypes` (``Operations.event_types``). Who may call is
:mod:`herald.access`; the one audit line of a change is :func:`herald.audit.audit`; a
body's field problems are gathered by :class:`herald.fields.Problems`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import structlog

from herald.adapters.base import MASK, DestinationConfig
from herald.adapters.registry import Registry
from herald.catalog import Catalog
from herald.errors import BadRequest, Conflict, NotFound, ValidationError
from herald.events import EventOperations
from herald.eventtypes import EventTypes
from herald.fields import (
    FLOW_FIELDS,
    MAX_TYPE_LENGTH,
    Problems,
    breaker_field,
    check_event_types,
    config_lengths,
    events_field,
    name_field,
    ordering_field,
    rate_field,
    str_field,
)
from herald.ids import new_id
from herald.match import SubscriptionIndex
from herald.model import (
    DEFAULT_TENANT,
    BlockedKey,
    Delivery,
    DeliveryFilter,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DestinationHealth,
    DestinationStatus,
    Event,
    HourCount,
    ReplayResult,
)
from herald.overview import Overview
from herald.overview import read as read_overview
from herald.payload_filter import compile_filter, document_of
from herald.pings import Pings
from herald.replays import Replays
from herald.retry import RetryPolicy
from herald.signing import generate_secret, parse_secret
from herald.store import Store

ROTATION_WINDOW_SECONDS = 24 * 3600

log = structlog.get_logger("herald.service")


FILTER_TEST_EVENTS = 50
"""How many of the tenant's newest events of a destination's types a filter's test tries."""
FILTER_TEST_SCAN = 2000
"""How many of the tenant's newest events a filter's test looks through for them."""


def filter_field(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A body's ``filter``: a payload filter (compiled here to check it, naming the
    path inside it when it is not one), or None for none."""
    spec = body.get("filter")
    if spec is None:
        return None
    compile_filter(spec)
    return dict(spec)


class Operations(EventOperations, Pings):
    """Every operation a caller may ask of destinations, deliveries, events, replays and
    event types, one object per process (``herald.wiring.components``), whatever face
    the caller came through.

    A change that gives the daemon work (a destination created, changed or deleted, a
    delivery re-queued, an event published, a replay's batch) is signalled once, here,
    to ``when_changed``: the daemon sets it to wake its relay and dispatcher."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        policy: RetryPolicy,
        *,
        catalog: Catalog | None = None,
        on_change: Callable[[], None] = lambda: None,
        max_destinations_per_tenant: int = 1000,
    ) -> None:
        self.store = store
        self.max_destinations_per_tenant = max_destinations_per_tenant
        self.registry = registry
        self.policy = policy
        # (``is None``: an empty catalog is falsy, and the caller's must be the one used.)
        self.catalog = catalog if catalog is not None else Catalog(store, registry)
        self.when_changed = on_change
        """Told of each change that gives the daemon work (see the class)."""
        self.replays = Replays(store, on_change=self._on_change)
        """Replays of deliveries (:mod:`herald.replays`)."""
        self.event_types = EventTypes(store)
        """The tenants' event-type catalogs (:mod:`herald.eventtypes`)."""

    def _on_change(self) -> None:
        self.when_changed()

    # --- destinations -------------------------------------------------------
    def _type_object(
        self, body: Mapping[str, Any], type_name: str
    ) -> tuple[str, str, Mapping[str, Any] | None]:
        """Find the type-keyed object under the canonical id or any alias: the canonical
        id, the name it is under, and the object."""
        canonical = self.registry.canonical(type_name)
        found = [n for n in self.registry.names_of(canonical) if n in body]
        if len(found) > 1:
            raise BadRequest(
                f"give the {canonical} config once, not under {' and '.join(found)}",
                field=found[1],
                code="invalid_request",
            )
        if not found:
            return canonical, canonical, None
        obj = body[found[0]]
        if not isinstance(obj, dict):
            raise BadRequest(f"{found[0]} must be an object", field=found[0], code="invalid_type")
        for key, value in obj.items():
            if value is not None and not isinstance(value, str):
                raise BadRequest(
                    f"{found[0]}.{key} must be a string",
                    field=f"{found[0]}.{key}",
                    code="invalid_type",
                )
        return canonical, found[0], obj

    def _known_keys(self, body: Mapping[str, Any], type_name: str, extra: Iterable[str]) -> None:
        allowed = {
            "name",
            "type",
            "events",
            "filter",
            *extra,
            *self.registry.names_of(self.registry.canonical(type_name)),
        }
        for key in body:
            if key not in allowed:
                raise BadRequest(f"unknown field {key!r}", field=key, code="unknown_field")

    async def create(self, tenant_id: str, body: Mapping[str, Any]) -> Destination:
        type_name = str_field(body, "type", required=True, max_length=MAX_TYPE_LENGTH)
        assert type_name is not None
        # Every field's problem at once, in one error (the rest in its ``also``).
        found = Problems()
        found.check(self._known_keys, body, type_name, (*FLOW_FIELDS, "ordering"))
        name = found.check(name_field, body)
        rate = found.check(rate_field, body)
        breaker = found.check(breaker_field, body)
        ordering = found.check(ordering_field, body)
        if name is None and not found.about("name"):
            found.add(ValidationError("name is required", field="name", code="field_required"))
        events = found.check(events_field, body, required=True)
        payload_filter = found.check(filter_field, body)
        canonical, used, raw = self._type_object(body, type_name)
        config = None
        if raw is None:
            found.add(
                ValidationError(
                    f"{type_name} (the type's config object) is required",
                    field=type_name,
                    code="field_required",
                )
            )
        else:
            config = found.check(self._parsed, type_name, raw, submitted=True)
            found.check(config_lengths, used, raw)
        found.raise_any()
        assert name is not None
        assert events is not None
        assert config is not None
        await self.registry.get(canonical).check(config, tenant_id=tenant_id)
        plain, secrets = config.split()
        now = time.time()
        dest = Destination(
            id=new_id("evtd_"),
            tenant_id=tenant_id,
            name=name,
            type=canonical,
            config=plain,
            secrets=secrets,
            events=events,
            filter=payload_filter,
            status=DestinationStatus.PENDING_VERIFICATION,
            created_at=now,
            updated_at=now,
            rate_limit_per_second=rate,
            circuit_breaker=bool(breaker),
            ordering=ordering or "none",
        )
        await self._within_destination_limit(tenant_id)
        await self.store.create_destination(dest, verification=self._verification(dest, now))
        self._on_change()
        return dest

    async def _within_destination_limit(self, tenant_id: str) -> None:
        """422 once the tenant has ``api.max_destinations_per_tenant``: counted before
        the insert, so creates racing each other may pass it together, by a few."""
        limit = self.max_destinations_per_tenant
        if await self.store.tenant_destination_count(tenant_id) >= limit:
            raise ValidationError(
                f"this tenant has {limit} event destinations, the most it may have;"
                " delete one before creating another",
                code="destination_limit_reached",
            )

    async def get(
        self, tenant_id: str | None, dest_id: str, *, deleted: bool = False
    ) -> Destination:
        """A destination of ``tenant_id`` (of any tenant when None: the operator's view)."""
        dest = await self.store.get_destination(tenant_id, dest_id)
        if dest is None or (dest.deleted and not deleted):
            raise NotFound(f"no event destination {dest_id}", code="destination_not_found")
        return dest

    async def list_destinations(
        self,
        tenant_id: str | None,
        *,
        status: DestinationStatus | None = None,
        type: str | None = None,
        before_id: str | None = None,
        limit: int = 20,
    ) -> tuple[list[Destination], bool]:
        canonical = self.registry.canonical(type) if type is not None else None
        rows = await self.store.list_destinations(
            tenant_id=tenant_id, status=status, type=canonical, before_id=before_id, limit=limit + 1
        )
        return rows[:limit], len(rows) > limit

    async def health(
        self, dests: Iterable[Destination], *, now: float | None = None
    ) -> dict[str, DestinationHealth]:
        """How ``dests`` (read in the caller's scope) have been answering, from the
        recorder's counters (one without an attempt yet left out)."""
        return await self.store.destination_health([d.id for d in dests], now=now or time.time())

    async def hourly(self, dest: Destination, *, now: float | None = None) -> list[HourCount]:
        """``dest``'s attempts per hour over the last 24 hours, from the counters."""
        return await self.store.destination_hours(dest.id, now=now or time.time())

    async def _write(
        self,
        tenant_id: str,
        dest_id: str,
        change: Callable[[Destination], Awaitable[tuple[Destination, bool]]],
    ) -> Destination:
        """Apply ``change`` (returns the new state and whether to re-verify) with
        optimistic concurrency: a destination changed meanwhile — by another
        request, or by its verification succeeding — is re-read and re-applied."""
        for _ in range(5):
            dest = await self.get(tenant_id, dest_id)
            updated, reverify = await change(dest)
            if updated == dest and not reverify:
                return dest  # nothing changes, not even updated_at (PATCH {})
            updated = replace(updated, updated_at=max(time.time(), dest.updated_at + 1e-6))
            verification = self._verification(updated, updated.updated_at) if reverify else None
            if await self.store.update_destination(
                updated, verification=verification, expected_updated_at=dest.updated_at
            ):
                self._on_change()
                return updated
        raise Conflict(
            "the destination is being changed concurrently; retry", code="concurrent_update"
        )

    async def update(self, tenant_id: str, dest_id: str, body: Mapping[str, Any]) -> Destination:
        current = await self.get(tenant_id, dest_id)
        if "type" in body and body["type"] is not None:
            requested = str_field(body, "type", required=False, max_length=MAX_TYPE_LENGTH)
            if requested is not None and self.registry.canonical(requested) != current.type:
                raise ValidationError(
                    "the type of a destination cannot change; create a new one",
                    field="type",
                    code="type_immutable",
                )
        found = Problems()
        found.check(self._known_keys, body, current.type, ("status", *FLOW_FIELDS, "ordering"))
        name = found.check(name_field, body)
        rate = found.check(rate_field, body)
        breaker = found.check(breaker_field, body)
        ordering = found.check(ordering_field, body)
        events = found.check(events_field, body, required=False)
        payload_filter = found.check(filter_field, body)
        status_raw = found.check(str_field, body, "status", required=False)
        found.raise_any()
        _, used, raw = self._type_object(body, current.type)
        model = self.registry.get(current.type).config_model
        given = None
        if raw is not None:
            # A credential echoed back as shown ("********") means "unchanged".
            secret_names = model.sensitive_fields()
            given = model.as_given(
                {k: v for k, v in raw.items() if not (k in secret_names and v == MASK)}
            )

        async def change(dest: Destination) -> tuple[Destination, bool]:
            changes: dict[str, Any] = {}
            reverify = False
            if name is not None:
                changes["name"] = name
            if events is not None:
                changes["events"] = events
            if "filter" in body:
                changes["filter"] = payload_filter
            if "rate_limit_per_second" in body:  # null: no limit from now on
                changes["rate_limit_per_second"] = rate
            if breaker is not None:
                changes["circuit_breaker"] = breaker
            if ordering is not None:
                changes["ordering"] = ordering
            if raw is not None and given is not None:
                stored = self._merged(dest)
                old = self.registry.parse_config(dest.type, stored)
                merged = {**stored, **given}
                repointed = self._parsed(dest.type, merged).target() != old.target()
                if repointed:
                    merged = self._repointed(model, used, stored, given)
                config = self._parsed(dest.type, merged, submitted=True)
                config_lengths(used, raw)
                adapter = self.registry.get(dest.type)
                # Credentials are not part of the target: dropping them is checked too.
                adapter.check_credentials(config, tenant_id=dest.tenant_id)
                if repointed:
                    await adapter.check(config, tenant_id=dest.tenant_id)
                    changes["status"] = DestinationStatus.PENDING_VERIFICATION
                    reverify = True
                plain, secrets = config.split()
                # Herald's own bookkeeping (a rotated secret's predecessor) is a credential
                # of the old target too: a new target starts without it.
                keep = {k: v for k, v in dest.config.items() if k.startswith("_")}
                keep_secrets = {k: v for k, v in dest.secrets.items() if k.startswith("_")}
                if repointed:
                    keep, keep_secrets = {}, {}
                changes["config"] = {**plain, **keep}
                changes["secrets"] = {**secrets, **keep_secrets}
            if status_raw is not None:
                changes["status"] = self._status_change(dest, status_raw, changes.get("status"))
            return replace(dest, **changes), reverify

        updated = await self._write(tenant_id, dest_id, change)
        if current.status is not updated.status and DestinationStatus.INACTIVE in (
            current.status,
            updated.status,
        ):
            paused = updated.status is DestinationStatus.INACTIVE
            log.info(
                "destination_paused" if paused else "destination_resumed",
                tenant_id=tenant_id,
                destination_id=dest_id,
                status=updated.status.value,
            )
        return updated

    def _parsed(
        self, type_name: str, raw: Mapping[str, Any], *, submitted: bool = False
    ) -> DestinationConfig:
        """``raw`` (a null is a field dropped) as ``type_name``'s config."""
        return self.registry.parse_config(
            type_name, {k: v for k, v in raw.items() if v is not None}, submitted=submitted
        )

    @staticmethod
    def _repointed(
        model: type[DestinationConfig],
        used: str,
        stored: Mapping[str, Any],
        given: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The config of a destination whose target changes: no stored credential goes
        to the new target unless this change gives it again (null drops it). One it
        does not give is a 422 ``credentials_required`` naming it, each in one error,
        or, if its type renews it (the webhook's signing secret), a fresh value."""
        secret_names = model.sensitive_fields()
        fresh = {k: v for k, v in stored.items() if k not in secret_names}
        fresh.update(given)
        found = Problems()
        for name in sorted((secret_names & stored.keys()) - given.keys()):
            if (renew := model.renewed.get(name)) is not None:
                fresh[name] = renew()
                continue
            found.add(
                ValidationError(
                    f"{used}.{name} must be given again (or null to drop it): the target"
                    " changes, and a stored credential never goes to a target it was not"
                    " given for",
                    field=f"{used}.{name}",
                    code="credentials_required",
                )
            )
        found.raise_any()
        return fresh

    def _merged(self, dest: Destination) -> dict[str, Any]:
        raw = {k: v for k, v in dest.config.items() if not k.startswith("_")}
        raw.update({k: v for k, v in dest.secrets.items() if not k.startswith("_")})
        return raw

    @staticmethod
    def _status_change(
        dest: Destination, value: str, implied: DestinationStatus | None
    ) -> DestinationStatus:
        if value not in (DestinationStatus.ACTIVE, DestinationStatus.INACTIVE):
            raise ValidationError(
                "status can be set to 'active' or 'inactive'", field="status", code="status_invalid"
            )
        wanted = DestinationStatus(value)
        current = implied or dest.status
        # Status toggles only between active and inactive (spec 001). A destination
        # awaiting verification leaves that state only through a successful ping;
        # otherwise inactive → active would activate a target nobody verified.
        if current is DestinationStatus.PENDING_VERIFICATION:
            raise Conflict(
                "the destination is pending verification; it becomes active on its first"
                " successful verification (POST …/verify to send another), and its status"
                " can be toggled after that",
                field="status",
                code="destination_not_verified",
            )
        return wanted

    async def delete(self, tenant_id: str, dest_id: str) -> Destination:
        dest = await self.get(tenant_id, dest_id)
        now = time.time()
        if not await self.store.delete_destination(tenant_id, dest_id, now=now):
            raise NotFound(f"no event destination {dest_id}", code="destination_not_found")
        self._on_change()
        return replace(dest, deleted_at=now, updated_at=now)

    async def verify(self, tenant_id: str, dest_id: str) -> Destination:
        """Send a fresh verification ping on the full retry schedule."""

        async def change(dest: Destination) -> tuple[Destination, bool]:
            return dest, True

        dest = await self._write(tenant_id, dest_id, change)
        log.info("verification_requested", tenant_id=tenant_id, destination_id=dest_id)
        return dest

    async def rotate_secret(
        self, tenant_id: str, dest_id: str, new_secret: str | None = None
    ) -> tuple[Destination, str]:
        """Install a new webhook secret; the previous one keeps signing for 24 h."""
        dest = await self.get(tenant_id, dest_id)
        if dest.type != "webhook":
            raise Conflict(
                "only webhook destinations have a signing secret", code="secret_not_supported"
            )
        if new_secret is None:
            new_secret = generate_secret()
        else:
            try:
                parse_secret(new_secret)
            except ValidationError as exc:
                raise ValidationError(exc.message, field="secret", code="secret_invalid") from exc
        secret = new_secret

        async def change(dest: Destination) -> tuple[Destination, bool]:
            now = time.time()
            secrets = {k: v for k, v in dest.secrets.items() if k != "_previous_secret"}
            config = {k: v for k, v in dest.config.items() if k != "_previous_secret_until"}
            if old := dest.secrets.get("secret"):
                secrets["_previous_secret"] = old
                config["_previous_secret_until"] = now + ROTATION_WINDOW_SECONDS
            secrets["secret"] = secret
            return replace(dest, secrets=secrets, config=config), False

        return await self._write(tenant_id, dest_id, change), secret

    # --- deliveries ---------------------------------------------------------
    async def list_deliveries(
        self, flt: DeliveryFilter, *, before_id: str | None = None, limit: int = 20
    ) -> tuple[list[Delivery], bool]:
        check_event_types(flt.event_types, field="event_type")
        rows = await self.store.list_deliveries(flt, before_id=before_id, limit=limit + 1)
        return rows[:limit], len(rows) > limit

    async def get_delivery(self, tenant_id: str | None, delivery_id: str) -> Delivery:
        delivery = await self.store.get_delivery(tenant_id, delivery_id, with_attempts=True)
        if delivery is None:
            raise NotFound(f"no event delivery {delivery_id}", code="delivery_not_found")
        return delivery

    async def retry(self, tenant_id: str | None, delivery_id: str) -> Delivery:
        """Re-queue one delivery now (a finished one gets a fresh cycle of attempts)."""
        delivery = await self.get_delivery(tenant_id, delivery_id)
        if delivery.kind is not DeliveryKind.EVENT:
            raise Conflict(
                f"{delivery.kind.value} deliveries cannot be retried", code="delivery_not_retryable"
            )
        dest = await self.store.get_destination(tenant_id, delivery.destination_id)
        if dest is None or dest.deleted:
            raise Conflict("the destination was deleted", code="destination_deleted")
        await self.store.requeue([delivery_id], now=time.time())
        self._on_change()
        return await self.get_delivery(tenant_id, delivery_id)

    async def test_filter(
        self, tenant_id: str, dest_id: str, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any] | None, list[tuple[Event, bool]]]:
        """Which of the tenant's newest events of the destination's types (at most
        :data:`FILTER_TEST_EVENTS`, among its :data:`FILTER_TEST_SCAN` newest events)
        would pass ``body``'s ``filter`` (the destination's own when it gives none; null:
        no filter). Nothing is stored or sent."""
        dest = await self.get(tenant_id, dest_id)
        for key in body:
            if key != "filter":
                raise BadRequest(f"unknown field {key!r}", field=key, code="unknown_field")
        spec = filter_field(body) if "filter" in body else dest.filter
        compiled = None if spec is None else compile_filter(spec)
        types: SubscriptionIndex[str] = SubscriptionIndex()
        types.add(dest.id, dest.events)
        recent = await self.store.recent_events(tenant_id, limit=FILTER_TEST_SCAN)
        chosen = [e for e in recent if types.match(e.type)][:FILTER_TEST_EVENTS]
        return spec, [(e, compiled is None or compiled.matches(document_of(e))) for e in chosen]

    async def blocked_keys(self, dest: Destination, *, limit: int = 50) -> list[BlockedKey]:
        """An ordered destination's keys whose next deliveries wait, each with the
        delivery they wait for (docs/ordering.md)."""
        return await self.store.blocked_keys(dest.id, limit=limit)

    # --- the operator console (herald.console): every tenant's view ----------
    async def overview(self, *, now: float | None = None, tenant_id: str | None = None) -> Overview:
        """What the console's front page shows (:func:`herald.overview.read`)."""
        return await read_overview(self.store, now=now, tenant_id=tenant_id)


__all__ = ["DEFAULT_TENANT", "DeliveryStatus", "Operations", "ReplayResult"]
