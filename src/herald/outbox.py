"""The outbox relay: producer rows in, events and deliveries out.

Each batch is claimed in ``seq`` order and, in one transaction, becomes stored
events plus one delivery per subscribed destination of the event's tenant;
the rows are removed. A row that cannot become an event moves to
``herald_outbox_rejected`` with its reason and never blocks the rows behind it.

Also the producer helper :func:`publish`, for Python producers on SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from herald.catalog import Catalog
from herald.errors import StorageError
from herald.handover import Handover, Room, wakes_claims
from herald.ids import new_id
from herald.match import validate_event_type
from herald.model import (
    DEFAULT_TENANT,
    DeliveryKind,
    DestinationStatus,
    Event,
    NewDelivery,
    OutboxRow,
    Rejection,
    RelayPlan,
)
from herald.retry import RetryPolicy, retry_storage
from herald.store.base import STALE_CATALOG, Store
from herald.timeutil import format_epoch, now, parse_timestamp

log = structlog.get_logger("herald.relay")


MAX_ID_LENGTH = 255


class Reject(Exception):
    """Why one outbox row cannot become an event (``code: detail``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


def _text(raw: bytes | None, name: str) -> str:
    if raw is None:
        raise Reject(f"missing_{name}", f"{name} is NULL")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject(f"invalid_{name}", f"{name} is not valid UTF-8 ({exc.reason})") from exc
    if "\x00" in text:
        raise Reject(f"invalid_{name}", f"{name} contains a NUL character")
    return text


def parse_row(row: OutboxRow, *, max_payload_bytes: int) -> Event:
    """Validate one raw outbox row into an event, or raise :class:`Reject`."""
    event_id = _text(row.id, "id")
    if not event_id.startswith("evt_") or len(event_id) <= 4:
        raise Reject("invalid_id", f"id {event_id[:64]!r} must start with 'evt_'")
    if len(event_id) > MAX_ID_LENGTH:
        raise Reject("invalid_id", f"id is longer than {MAX_ID_LENGTH} characters")
    tenant = _text(row.tenant_id, "tenant_id") if row.tenant_id is not None else DEFAULT_TENANT
    if not tenant or len(tenant) > MAX_ID_LENGTH:
        raise Reject("invalid_tenant_id", "tenant_id must be 1 to 255 characters")
    type_ = _text(row.type, "type")
    try:
        validate_event_type(type_)
    except ValueError as exc:
        raise Reject("invalid_type", str(exc)) from exc
    if row.data is None:
        raise Reject("missing_data", "data is NULL")
    if len(row.data) > max_payload_bytes:
        raise Reject(
            "payload_too_large",
            f"data is {len(row.data)} bytes, over the {max_payload_bytes}-byte limit",
        )
    try:
        data = orjson.loads(row.data)
    except orjson.JSONDecodeError as exc:
        raise Reject("invalid_json", f"data is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise Reject("invalid_data", f"data must be a JSON object, not {type(data).__name__}")
    # The producer's own bytes go out, not a re-serialisation: a parser round
    # trip would turn integers beyond 64 bits into floats and change the payload.
    payload = row.data.strip()
    created_raw = _text(row.created_at, "created_at")
    try:
        instant = parse_timestamp(created_raw)
    except ValueError as exc:
        raise Reject("invalid_created_at", str(exc)) from exc
    return Event(
        id=event_id,
        tenant_id=tenant,
        type=type_,
        created_at=instant.text,
        created_ts=instant.epoch,
        data=payload,
    )


def _lossless(raw: bytes | None) -> str | None:
    # Kept for the operator: undecodable bytes become U+FFFD, NUL becomes visible.
    if raw is None:
        return None
    return raw.decode("utf-8", "replace").replace("\x00", "\\u0000")


class Relay:
    """Moves outbox rows into events and deliveries, batch by batch."""

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        policy: RetryPolicy,
        *,
        batch_size: int,
        poll_interval: float,
        max_payload_bytes: int,
        on_deliveries: Callable[[], None] = lambda: None,
        on_batch: Callable[[RelayPlan], None] = lambda plan: None,
        handoff: Handover | None = None,
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._policy = policy
        self._batch = batch_size
        self._poll = poll_interval
        self._max_payload = max_payload_bytes
        self._on_deliveries = on_deliveries
        self._on_batch = on_batch
        # New deliveries go straight to this process's dispatcher, leased to it in the
        # relay's own transaction, as far as it has room: no claim query, no wake-up.
        self._handoff = handoff
        self._wake = asyncio.Event()
        self.running = False
        self.storage_error: str | None = None
        """Why the last pass failed while the database keeps failing (/readyz shows it)."""

    def wake(self) -> None:
        """New rows were written by this process: look now instead of at the next poll."""
        self._wake.set()

    def process(
        self, rows: list[OutboxRow], existing: set[str], room: Room | None = None
    ) -> RelayPlan:
        """Pure planning of one batch (runs inside the store's transaction); with a
        ``room``, the deliveries it takes are planned leased to its dispatcher."""
        plan = RelayPlan()
        seen = set(existing)
        ts = now()
        for row in rows:
            try:
                event = parse_row(row, max_payload_bytes=self._max_payload)
                if event.id in seen:
                    raise Reject("duplicate_id", f"event {event.id} was already ingested")
            except Reject as rej:
                plan.rejected.append(
                    Rejection(
                        seq=row.seq,
                        id=_lossless(row.id),
                        tenant_id=_lossless(row.tenant_id),
                        type=_lossless(row.type),
                        data=_lossless(row.data),
                        created_at=_lossless(row.created_at),
                        reason=str(rej),
                    )
                )
                continue
            seen.add(event.id)
            plan.events.append(event)
            for entry in self._catalog.subscribers(event.tenant_id, event.type):
                held = entry.dest.status != DestinationStatus.ACTIVE
                lease = room if room is not None and not held and room.take(entry.dest.id) else None
                plan.deliveries.append(
                    NewDelivery(
                        id=new_id("dlv_"),
                        tenant_id=event.tenant_id,
                        event_id=event.id,
                        event_type=event.type,
                        destination_id=entry.dest.id,
                        kind=DeliveryKind.EVENT,
                        max_attempts=self._policy.max_attempts,
                        next_attempt_at=ts if lease is None else lease.lease_until,
                        held=held,
                        created_at=ts,
                        lease_owner=None if lease is None else lease.owner,
                    )
                )
        return plan

    async def run_once(self) -> int:
        """Relay one batch; returns how many outbox rows it consumed."""
        for _ in range(10):
            await self._catalog.refresh()
            room = self._handoff.room() if self._handoff is not None else None
            plan, count = await self._store.relay(
                self._batch,
                functools.partial(self.process, room=room),
                destinations_version=self._catalog.version,
            )
            if count != STALE_CATALOG:
                break
        else:
            return 0  # destinations keep changing under us: try again on the next pass
        if count:
            for rej in plan.rejected:
                log.warning("outbox_row_rejected", seq=rej.seq, event_id=rej.id, reason=rej.reason)
            if plan.leased:
                assert self._handoff is not None
                self._handoff.receive(plan)
            if wakes_claims(plan, room):
                self._on_deliveries()
            self._on_batch(plan)
        return count

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set; polls when idle (SQLite has no notifications)."""
        self.running = True
        notified = await self._store.watch_outbox(self.wake)
        if notified:
            log.info("relay_listening", channel="herald_outbox")

        def trouble(exc: StorageError, delay: float) -> None:
            # The database is away (locked, restarting, unreachable, full): nothing was
            # claimed or lost, so wait and try again; /readyz reports it meanwhile.
            self.storage_error = exc.message
            log.warning("relay_storage_error", error=exc.message, retry_in=delay)

        try:
            while not stop.is_set():
                count = await retry_storage(
                    self.run_once,
                    on_error=trouble,
                    sleep=functools.partial(_sleep_unless, stop),
                    until=stop.is_set,
                )
                if count is None:
                    break  # stopping while the database is away
                self.storage_error = None
                if count >= self._batch:
                    continue
                self._wake.clear()
                waiters = [
                    asyncio.ensure_future(stop.wait()),
                    asyncio.ensure_future(self._wake.wait()),
                ]
                try:
                    await asyncio.wait(
                        waiters, timeout=self._poll, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            self.running = False


async def _sleep_unless(stop: asyncio.Event, delay: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=delay)


def publish(
    conn: sqlite3.Connection,
    type: str,
    data: dict[str, Any],
    *,
    tenant_id: str = DEFAULT_TENANT,
    id: str | None = None,
    created_at: str | None = None,
) -> str:
    """Write one event into ``herald_outbox`` on the producer's own connection.

    Call it inside the producer's transaction, next to the business write it
    announces; Herald picks the row up after the transaction commits.
    Returns the event id.
    """
    validate_event_type(type)
    event_id = id or new_id("evt_")
    if not event_id.startswith("evt_"):
        raise ValueError("event ids start with 'evt_'")
    conn.execute(
        "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at) VALUES (?, ?, ?, ?, ?)",
        (event_id, tenant_id, type, orjson.dumps(data).decode(), created_at or format_epoch(now())),
    )
    return event_id
