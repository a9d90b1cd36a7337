"""Destination, delivery and event operations shared by the CLI and the REST API.

Every rule about what a caller may do lives here once: body validation, state
transitions, verification, test pings, secret rotation, retry and replay.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import orjson
import structlog

from herald.adapters.base import MASK
from herald.adapters.registry import Registry
from herald.attempt import attempt, log_ids
from herald.catalog import Catalog
from herald.errors import BadRequest, Conflict, HeraldError, NotFound, ValidationError
from herald.fields import (
    MAX_TYPE_LENGTH,
    check_event_types,
    config_lengths,
    events_field,
    name_field,
    str_field,
)
from herald.ids import new_id
from herald.ingest import event_id_problem, reserved_type_problem, traceparent_problem
from herald.match import validate_event_type
from herald.metrics import replay_source
from herald.model import (
    DEFAULT_TENANT,
    TEST_EVENT_TYPE,
    VERIFICATION_EVENT_TYPE,
    Delivery,
    DeliveryFilter,
    DeliveryKind,
    DeliveryStatus,
    Destination,
    DestinationStatus,
    DueDelivery,
    Event,
    NewDelivery,
    Replay,
    ReplayOutcome,
    ReplayResult,
)
from herald.retry import RetryPolicy
from herald.signing import generate_secret, parse_secret
from herald.store import Store
from herald.timeutil import format_epoch, parse_timestamp

ROTATION_WINDOW_SECONDS = 24 * 3600
REPLAY_BATCH = 500
REPLAY_IDS_KEPT = 100

replay_log = structlog.get_logger("herald.replay")
log = structlog.get_logger("herald.service")
audit_log = structlog.get_logger("herald.audit")


def audit(action: str, *, by: str, tenant_id: str, **fields: object) -> None:
    """The one audit line of a change a person asked for, written alike by the CLI,
    the API and the console: ``by`` names who (``cli:<OS user>``, ``api:<tenant>``,
    ``console:<key id>``), ``fields`` the objects (ids, never a body or a secret)."""
    audit_log.info(action, by=by, tenant_id=tenant_id, **fields)


def update_fields(body: Mapping[str, Any]) -> dict[str, object]:
    """What an update's audit line says it changed: the fields' names, and the status
    it set (pause and resume are updates of the status)."""
    out: dict[str, object] = {"changed": sorted(body)}
    if isinstance(body.get("status"), str):
        out["status"] = body["status"]
    return out


OVERVIEW_REJECTED_MAX = 1000
"""The overview counts rejected outbox rows up to this many ("1000+" past it)."""
OVERVIEW_FAILING_MAX = 5
"""The overview names this many of the destinations failing most."""
EVENT_DELIVERIES_MAX = 200
"""An event's page lists at most this many of its deliveries."""


@dataclass(frozen=True, slots=True)
class Overview:
    """The operator console's front page: counts, never rows."""

    now: float
    last_hour: list[tuple[str, int, int]]
    """(outcome, minute number since the epoch, finished deliveries) over the last hour."""
    last_day: list[tuple[str, int, int]]
    """The same in 15-minute buckets over the last 24 hours."""
    due: int
    scheduled_retry: int
    held: int
    oldest_due_age: float | None
    rejected: int
    in_flight: int
    failing: list[tuple[str, str, int]]
    """(destination id, name, failed deliveries) over the last hour, the most first."""


def replay_filter(flt: DeliveryFilter) -> dict[str, Any]:
    """The filter a replay used, as stored with it and shown in its JSON: the fields
    that narrowed it, with times as RFC 3339 text."""
    out: dict[str, Any] = {}
    if flt.destination_id is not None:
        out["destination_id"] = flt.destination_id
    if flt.status is not None:
        out["status"] = flt.status.value
    if flt.event_types:
        out["event_types"] = list(flt.event_types)
    if flt.since is not None:
        out["since"] = format_epoch(flt.since)
    if flt.until is not None:
        out["until"] = format_epoch(flt.until)
    if flt.ids:
        # An ids file may name thousands: the row keeps how many, and the first few.
        out["delivery_ids"] = list(flt.ids[:REPLAY_IDS_KEPT])
        if len(flt.ids) > REPLAY_IDS_KEPT:
            out["delivery_id_count"] = len(flt.ids)
    return out


T = TypeVar("T")


class Problems:
    """The problems of one request body's fields, gathered so that one error names
    them all (the first, with the others in its ``also``), as the API's ``errors``
    array promises."""

    def __init__(self) -> None:
        self.found: list[HeraldError] = []

    def check(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``, or None with its problem kept."""
        try:
            return fn(*args, **kwargs)
        except (ValidationError, BadRequest) as exc:
            self.add(exc)
            return None

    def add(self, exc: HeraldError) -> None:
        """Keep ``exc`` and what rides with it, one problem per field."""
        for problem in (exc, *exc.also):
            if problem.field is None or not self.about(problem.field):
                self.found.append(problem)

    def about(self, field: str) -> bool:
        return any(p.field == field for p in self.found)

    def raise_any(self) -> None:
        if self.found:
            # A malformed field (400) leads, as it decides the status.
            first, *rest = sorted(self.found, key=lambda p: not isinstance(p, BadRequest))
            first.also = tuple(rest)
            raise first


class DestinationService:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        policy: RetryPolicy,
        *,
        catalog: Catalog | None = None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.policy = policy
        self.catalog = catalog or Catalog(store, registry)
        self._on_change = on_change

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
            *extra,
            *self.registry.names_of(self.registry.canonical(type_name)),
        }
        for key in body:
            if key not in allowed:
                raise BadRequest(f"unknown field {key!r}", field=key, code="unknown_field")

    def _verification(self, dest: Destination, now: float) -> tuple[Event, NewDelivery]:
        event = Event(
            id=new_id("evt_"),
            tenant_id=dest.tenant_id,
            type=VERIFICATION_EVENT_TYPE,
            created_at=format_epoch(now),
            created_ts=now,
            data=orjson.dumps({"destination_id": dest.id}),
        )
        delivery = NewDelivery(
            id=new_id("dlv_"),
            tenant_id=dest.tenant_id,
            event_id=event.id,
            event_type=event.type,
            destination_id=dest.id,
            kind=DeliveryKind.VERIFICATION,
            max_attempts=0,  # its first round: the daemon that attempts it decides the budget
            next_attempt_at=now,
            held=False,
            created_at=now,
        )
        return event, delivery

    async def create(self, tenant_id: str, body: Mapping[str, Any]) -> Destination:
        type_name = str_field(body, "type", required=True, max_length=MAX_TYPE_LENGTH)
        assert type_name is not None
        # Every field's problem at once, in one error (the rest in its ``also``).
        found = Problems()
        found.check(self._known_keys, body, type_name, ())
        name = found.check(name_field, body)
        if name is None and not found.about("name"):
            found.add(ValidationError("name is required", field="name", code="field_required"))
        events = found.check(events_field, body, required=True)
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
            config = found.check(
                self.registry.parse_config,
                type_name,
                {k: v for k, v in raw.items() if v is not None},
            )
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
            status=DestinationStatus.PENDING_VERIFICATION,
            created_at=now,
            updated_at=now,
        )
        await self.store.create_destination(dest, verification=self._verification(dest, now))
        self._on_change()
        return dest

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
        found.check(self._known_keys, body, current.type, ("status",))
        name = found.check(name_field, body)
        events = found.check(events_field, body, required=False)
        status_raw = found.check(str_field, body, "status", required=False)
        found.raise_any()
        _, used, raw = self._type_object(body, current.type)
        if raw is not None:
            # A credential echoed back as shown ("********") means "unchanged".
            secret_names = self.registry.get(current.type).config_model.sensitive_fields()
            raw = {k: v for k, v in raw.items() if not (k in secret_names and v == MASK)}

        async def change(dest: Destination) -> tuple[Destination, bool]:
            changes: dict[str, Any] = {}
            reverify = False
            if name is not None:
                changes["name"] = name
            if events is not None:
                changes["events"] = events
            if raw is not None:
                old = self.registry.parse_config(dest.type, self._merged(dest))
                merged = {**self._merged(dest), **raw}
                config = self.registry.parse_config(
                    dest.type, {k: v for k, v in merged.items() if v is not None}
                )
                config_lengths(used, raw)
                adapter = self.registry.get(dest.type)
                # Credentials are not part of the target: dropping them is checked too.
                adapter.check_credentials(config, tenant_id=dest.tenant_id)
                if config.target() != old.target():
                    await adapter.check(config, tenant_id=dest.tenant_id)
                    changes["status"] = DestinationStatus.PENDING_VERIFICATION
                    reverify = True
                plain, secrets = config.split()
                keep = {k: v for k, v in dest.config.items() if k.startswith("_")}
                keep_secrets = {k: v for k, v in dest.secrets.items() if k.startswith("_")}
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

    async def test(self, tenant_id: str, dest_id: str) -> Delivery:
        """Send ``test.ping`` once, no retry, to an active destination; return the delivery."""
        dest = await self.get(tenant_id, dest_id)
        if dest.status is not DestinationStatus.ACTIVE:
            raise Conflict(
                f"test events go only to active destinations; this one is {dest.status.value}",
                code="destination_not_active",
            )
        now = time.time()
        event = Event(
            id=new_id("evt_"),
            tenant_id=tenant_id,
            type=TEST_EVENT_TYPE,
            created_at=format_epoch(now),
            created_ts=now,
            data=b'{"ok":true}',
        )
        new = NewDelivery(
            id=new_id("dlv_"),
            tenant_id=tenant_id,
            event_id=event.id,
            event_type=event.type,
            destination_id=dest.id,
            kind=DeliveryKind.TEST,
            max_attempts=1,
            next_attempt_at=None,
            held=False,
            created_at=now,
        )
        await self.store.insert_deliveries([event], [new])
        await self.catalog.refresh()
        if self.catalog.get(dest.id) is None:
            await self.catalog.refresh(force=True)
        item = DueDelivery(new.id, dest.id, DeliveryKind.TEST, 0, 1, event)
        record, type_id = await attempt(self.catalog, self.policy, item)
        await self.store.record_attempts([record])
        # One line whatever the outcome (with the API's request_id when it asked).
        log.info(
            "test_ping_sent",
            **log_ids(item),
            destination_type=type_id,
            outcome=record.attempt.outcome.value,
            response_status=record.attempt.response_status,
            error=record.attempt.error,
        )
        delivery = await self.store.get_delivery(tenant_id, new.id, with_attempts=True)
        assert delivery is not None
        return delivery

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

    async def replay(
        self,
        flt: DeliveryFilter,
        *,
        by: str = "service",
        dry_run: bool = False,
        sample_size: int = 5,
        rate_per_second: float | None = None,
        progress: Callable[[int, int], None] = lambda done, total: None,
    ) -> ReplayResult:
        """Re-queue every delivery matching ``flt``, in batches; ``dry_run`` only counts.

        Every replay that re-queues (the CLI's, the API's, the console's) is stored as
        a :class:`Replay` with an id (``rpl_…``) before its first batch, and the
        deliveries it re-queues carry that id, so its outcome can be counted later
        (:meth:`get_replay`). ``flt.tenant_id`` None is an operator-wide replay. A dry
        run stores nothing.

        With ``rate_per_second``, re-queued deliveries become due in one-second
        steps of that many, so a large replay never floods a recovering endpoint.
        ``by`` says who asked (``cli:<OS user>``, ``api:<tenant>``); every replay,
        dry or not, is logged here once with who, the filter and how many, so the
        CLI and the API cannot drift apart in what the audit trail records.
        """
        check_event_types(flt.event_types)
        # Only event deliveries are replayed (verifications and test pings are not):
        # count and sample just those, so a dry run says what a real run re-queues.
        flt = replace(flt, kind=DeliveryKind.EVENT)
        total = await self.store.count_deliveries(flt)
        sample, _ = await self.list_deliveries(flt, limit=sample_size)
        record: Replay | None = None
        if not dry_run:
            record = Replay(
                id=new_id("rpl_"),
                tenant_id=flt.tenant_id,
                filter=replay_filter(flt),
                by=by,
                created_at=time.time(),
                matched=total,
            )
            await self.store.create_replay(record)
            requeued = 0
            if total:
                requeued = await self._requeue_matching(
                    flt, total, rate_per_second, progress, record.id
                )
            finished = time.time()
            await self.store.update_replay(record.id, requeued=requeued, finished_at=finished)
            # In the database, not this process: the daemons' /metrics count CLI replays.
            await self.store.count_replay(replay_source(by), requeued)
            record = replace(
                record,
                requeued=requeued,
                finished_at=finished,
                outcome=ReplayOutcome(pending=requeued),
            )
        replay_log.info(
            "replay",
            by=by,
            replay_id=None if record is None else record.id,
            tenant_id=flt.tenant_id,
            destination_id=flt.destination_id,
            status=flt.status.value if flt.status else None,
            event_types=list(flt.event_types),
            since=format_epoch(flt.since) if flt.since is not None else None,
            until=format_epoch(flt.until) if flt.until is not None else None,
            ids=len(flt.ids),
            dry_run=dry_run,
            matched=total,
            requeued=0 if record is None else record.requeued,
            rate_per_second=rate_per_second or None,
        )
        return ReplayResult(
            total, 0 if record is None else record.requeued, sample, dry_run, record
        )

    async def _requeue_matching(
        self,
        flt: DeliveryFilter,
        total: int,
        rate_per_second: float | None,
        progress: Callable[[int, int], None],
        replay_id: str,
    ) -> int:
        step = max(int(rate_per_second), 1) if rate_per_second else None
        requeued = 0
        seen = 0
        before: str | None = None
        started = time.time()
        while True:
            batch = await self.store.list_deliveries(flt, before_id=before, limit=REPLAY_BATCH)
            if not batch:
                break
            # Deliveries created after the replay began are not part of it.
            ids = [d.id for d in batch if d.created_at <= started]
            chunks = (
                [ids] if step is None else [ids[i : i + step] for i in range(0, len(ids), step)]
            )
            for chunk in chunks:
                due = time.time() if step is None else started + requeued // step
                requeued += await self.store.requeue(chunk, now=due, replay_id=replay_id)
            seen += len(batch)
            before = batch[-1].id
            # Progress is stored as it goes: a console follows a large replay from it.
            await self.store.update_replay(replay_id, requeued=requeued, finished_at=None)
            progress(min(seen, total), total)
            self._on_change()
        return requeued

    async def get_replay(self, tenant_id: str | None, replay_id: str) -> Replay:
        """A replay with its deliveries counted by status now; a tenant sees only its
        own (``tenant_id`` None: an operator, who sees every one)."""
        replay = await self.store.get_replay(tenant_id, replay_id)
        if replay is None:
            raise NotFound(f"no replay {replay_id}", code="replay_not_found")
        return replay

    async def list_replays(
        self, tenant_id: str | None, *, before_id: str | None = None, limit: int = 20
    ) -> tuple[list[Replay], bool]:
        """Replays newest first with their outcomes (every tenant's if ``tenant_id`` is None)."""
        rows = await self.store.list_replays(
            tenant_id=tenant_id, before_id=before_id, limit=limit + 1
        )
        return rows[:limit], len(rows) > limit

    # --- events -------------------------------------------------------------
    async def publish(
        self,
        tenant_id: str,
        type: str,
        data: Any,
        *,
        event_id: str | None = None,
        created_at: str | None = None,
        traceparent: str | None = None,
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
        )
        self._on_change()
        return Event(
            event_id, tenant_id, type, instant_text, instant_ts, payload, traceparent or None
        )

    # --- the operator console (herald.console): every tenant's view ----------
    async def overview(self, *, now: float | None = None) -> Overview:
        """What the console's front page shows, from indexed reads only: finished
        deliveries by outcome per minute over the last hour and per 15 minutes over
        the last day, the pending backlog, the oldest due delivery, rejected rows."""
        now = time.time() if now is None else now
        hour = await self.store.outcome_counts(since=now - 3600, bucket_seconds=60)
        day = await self.store.outcome_counts(since=now - 86_400, bucket_seconds=900)
        backlog = await self.store.delivery_counts(now=now)
        next_due = await self.store.next_due_at()
        oldest_due_age = None if next_due is None or next_due > now else now - next_due
        rejected = await self.store.count_rejected(up_to=OVERVIEW_REJECTED_MAX + 1)
        failing = []
        for dest_id, failures in await self.store.failing_destinations(
            since=now - 3600, limit=OVERVIEW_FAILING_MAX
        ):
            dest = await self.store.get_destination(None, dest_id)
            failing.append((dest_id, dest.name if dest else dest_id, failures))
        return Overview(
            now=now,
            last_hour=hour,
            last_day=day,
            due=backlog["due"],
            scheduled_retry=backlog["scheduled_retry"],
            held=backlog["held"],
            oldest_due_age=oldest_due_age,
            rejected=rejected,
            in_flight=await self.store.in_flight(),
            failing=failing,
        )

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
        # By event id alone, which its index answers (with the tenant too, SQLite would
        # walk the tenant's deliveries); another tenant's event of the same id is few rows.
        flt = DeliveryFilter(event_id=event.id)
        found, _ = await self.list_deliveries(flt, limit=EVENT_DELIVERIES_MAX)
        return event, [d for d in found if d.tenant_id == event.tenant_id]

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


__all__ = ["DEFAULT_TENANT", "DeliveryStatus", "DestinationService", "Overview", "ReplayResult"]
