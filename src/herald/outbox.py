"""The outbox relay: producer rows in, events and deliveries out.

Each batch is claimed in ``seq`` order and, in one transaction, becomes stored
events plus one delivery per subscribed destination of the event's tenant;
the rows are removed. A row that cannot become an event moves to
``herald_outbox_rejected`` with its reason and never blocks the rows behind it.

Also the producer helper :func:`publish`, for Python producers on any DB-API connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from herald import tracing
from herald.catalog import Catalog
from herald.errors import StorageError
from herald.handover import Handover, Room, wakes_claims
from herald.ids import new_id
from herald.ingest import (
    Reject,
    about_destination,
    ordering_key_problem,
    parse_row,
    reserved_type_problem,
    traceparent_problem,
)
from herald.match import validate_event_type
from herald.model import (
    DEFAULT_TENANT,
    DeliveryKind,
    DestinationStatus,
    NewDelivery,
    OutboxRow,
    Rejection,
    RelayPlan,
)
from herald.retry import RetryPolicy, retry_storage
from herald.store import Store
from herald.store.base import STALE_CATALOG, EventKey
from herald.timeutil import format_epoch, now, parse_timestamp

log = structlog.get_logger("herald.relay")


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
        idle_poll: float,
        max_payload_bytes: int,
        on_deliveries: Callable[[], None] = lambda: None,
        on_batch: Callable[[RelayPlan], None] = lambda plan: None,
        handover: Handover | None = None,
        on_storage: Callable[[str, bool], None] = lambda component, ok: None,
    ) -> None:
        self._on_storage = on_storage
        """Told of each pass's database round trips: ``("relay", ok)`` (for metrics)."""
        self._store = store
        self._catalog = catalog
        self._policy = policy
        self._batch = batch_size
        self._poll = poll_interval
        self._idle_poll = max(idle_poll, poll_interval)
        self._max_payload = max_payload_bytes
        self._on_deliveries = on_deliveries
        self._on_batch = on_batch
        # New deliveries go straight to this process's dispatcher, leased to it in the
        # relay's own transaction, as far as it has room: no claim query, no wake-up.
        self._handover = handover
        self._wake = asyncio.Event()
        self.running = False
        self.storage_error: str | None = None
        """Why the last pass failed while the database keeps failing (/readyz shows it)."""

    def wake(self) -> None:
        """New rows were written by this process: look now instead of at the next poll."""
        self._wake.set()

    def process(
        self, rows: list[OutboxRow], existing: set[EventKey], room: Room | None = None
    ) -> RelayPlan:
        """Pure planning of one batch (runs inside the store's transaction); with a
        ``room``, the deliveries it takes are planned leased to its dispatcher.
        ``existing``: the (tenant, id) of the batch's events already stored; an id is
        a duplicate only within its tenant."""
        plan = RelayPlan()
        seen = set(existing)
        ts = now()
        for row in rows:
            try:
                event = parse_row(row, max_payload_bytes=self._max_payload, marks=self._store.marks)
                if (event.tenant_id, event.id) in seen:
                    raise Reject("duplicate_id", f"event {event.id} was already ingested")
                if (refused := self._catalog.refusal(event)) is not None:
                    raise Reject(*refused)
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
            seen.add((event.tenant_id, event.id))
            plan.events.append(event)
            about = about_destination(row.about)
            if row.traceparent and event.traceparent is None:  # (empty: none given)
                plan.untraced.append((row.seq, event.id, row.traceparent))
            wanted, filtered = self._catalog.fan_out(event)
            plan.filtered.extend(filtered)
            for entry in wanted:
                if entry.dest.id == about:
                    continue  # an operational event never goes to the destination it is about
                held = entry.dest.status != DestinationStatus.ACTIVE
                # A destination under flow control (herald.flow) gets its deliveries
                # through claims only: a claim spends its tokens and keeps its circuit.
                gated = entry.dest.rate_limit_per_second is not None or entry.dest.circuit_breaker
                lease = (
                    room
                    if room is not None
                    and not held
                    and not gated
                    and room.take(entry.dest.id, event.tenant_id)
                    else None
                )
                plan.deliveries.append(
                    NewDelivery(
                        id=new_id("dlv_"),
                        tenant_id=event.tenant_id,
                        event_id=event.id,
                        event_type=event.type,
                        destination_id=entry.dest.id,
                        kind=DeliveryKind.EVENT,
                        max_attempts=0,  # its first round: the budget is the daemon's
                        next_attempt_at=ts if lease is None else lease.lease_until,
                        held=held,
                        created_at=ts,
                        lease_owner=None if lease is None else lease.owner,
                        ordering_key=event.ordering_key if entry.dest.ordering == "key" else None,
                    )
                )
        return plan

    async def run_once(self) -> int:
        """Relay one batch; returns how many outbox rows it consumed."""
        started = time.time()
        for _ in range(10):
            await self._catalog.refresh()
            room = self._handover.room() if self._handover is not None else None
            plan, count = await self._store.relay(
                self._batch,
                functools.partial(self.process, room=room),
                destinations_version=self._catalog.version,
                ordered=self._catalog.ordered,
            )
            if count != STALE_CATALOG:
                break
        else:
            return 0  # destinations keep changing under us: try again on the next pass
        if count:
            self._committed(plan, room, started, count)
        return count

    async def relay_source(
        self, source: str, rows: list[OutboxRow]
    ) -> tuple[RelayPlan, list[OutboxRow]] | None:
        """Relay rows read from the outbox source ``source`` (``herald.sources``) into
        Herald's database, as :meth:`run_once` does the built-in outbox's: the plan,
        and the rows whose events were already stored as they are; None when the
        destinations kept changing (nothing written: read the rows again)."""
        started = time.time()
        for _ in range(10):
            await self._catalog.refresh()
            room = self._handover.room() if self._handover is not None else None
            done = await self._store.relay_source(
                source,
                rows,
                functools.partial(self.process, room=room),
                destinations_version=self._catalog.version,
                ordered=self._catalog.ordered,
            )
            if done is not None:
                self._committed(done[0], room, started, len(rows), source=source)
                return done
        return None

    def _committed(
        self, plan: RelayPlan, room: Room | None, started: float, count: int, *, source: str = ""
    ) -> None:
        """After a batch's commit: say what was rejected, hand the leased deliveries
        over, wake the dispatcher, count and trace."""
        named = {"source": source} if source else {}
        for rej in plan.rejected:
            log.warning(
                "outbox_row_rejected", seq=rej.seq, event_id=rej.id, reason=rej.reason, **named
            )
        for seq, event_id, raw in plan.untraced:
            log.warning(
                "traceparent_ignored",
                seq=seq,
                event_id=event_id,
                reason=traceparent_problem(raw.decode("ascii", "replace")),
            )
        if plan.leased:
            assert self._handover is not None
            self._handover.receive(plan)
        if wakes_claims(plan, room):
            self._on_deliveries()
        self._on_batch(plan)
        if tracing.enabled():
            tracing.record(
                tracing.RELAY_SPAN,
                started=started,
                ended=time.time(),
                attributes={
                    "herald.relay.rows": count,
                    "herald.relay.events": len(plan.events),
                    "herald.relay.deliveries": len(plan.deliveries),
                    "herald.relay.rejected": len(plan.rejected),
                    "herald.relay.handed_over": len(plan.leased),
                },
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set. Woken when rows may have arrived (PostgreSQL's
        notifications, SQLite's commit check every ``poll_interval``), it queries the
        outbox only then, and every ``idle_poll`` seconds in case a wake-up was lost;
        where the store cannot tell, it queries every ``poll_interval``."""
        self.running = True
        # Clear while passes follow each other at once (each took a full batch): a
        # watch that looks for commits need not look then.
        listening = asyncio.Event()
        listening.set()
        watched = await self._store.watch_outbox(self.wake, every=self._poll, listening=listening)
        idle_wait = self._idle_poll if watched else self._poll
        if watched:
            log.info("relay_watching", database=self._store.dialect.name)

        def trouble(exc: StorageError, delay: float) -> None:
            # The database is away (locked, restarting, unreachable, full): nothing was
            # claimed or lost, so wait and try again; /readyz reports it meanwhile.
            self.storage_error = exc.message
            self._on_storage("relay", False)
            log.warning("relay_storage_error", error=exc.message, retry_in=delay)

        try:
            while not stop.is_set():
                # Cleared before the pass: rows that arrive during it wake the next one.
                self._wake.clear()
                count = await retry_storage(
                    self.run_once,
                    on_error=trouble,
                    sleep=functools.partial(sleep_unless, stop),
                    until=stop.is_set,
                )
                if count is None:
                    break  # stopping while the database is away
                self.storage_error = None
                self._on_storage("relay", True)
                if count >= self._batch:
                    listening.clear()
                    continue
                listening.set()
                waiters = [
                    asyncio.ensure_future(stop.wait()),
                    asyncio.ensure_future(self._wake.wait()),
                ]
                try:
                    await asyncio.wait(
                        waiters, timeout=idle_wait, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            self.running = False


async def sleep_unless(stop: asyncio.Event, delay: float) -> None:
    """Sleep ``delay`` seconds, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=delay)


_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s", "numeric": ":{n}"}
_MYSQL_DRIVERS = frozenset({"pymysql", "MySQLdb", "mysql", "mariadb"})


def _driver(conn: Any) -> tuple[str, str]:
    """The DB-API module a connection comes from, and its placeholder."""
    name = type(conn).__module__.partition(".")[0]
    module = sys.modules.get(name)
    style = getattr(module, "paramstyle", "qmark")
    if style not in _PLACEHOLDERS:  # "named": every driver that has it has one above too
        raise ValueError(f"{name}'s paramstyle {style!r} is not supported")
    return name, _PLACEHOLDERS[style]


def publish(
    conn: Any,
    type: str,
    data: dict[str, Any],
    *,
    tenant_id: str = DEFAULT_TENANT,
    id: str | None = None,
    created_at: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
    table: str = "herald_outbox",
) -> str:
    """Write one event into the outbox ``table`` on the producer's own connection: any
    DB-API connection (sqlite3, psycopg, PyMySQL, mysqlclient), its placeholder taken
    from the driver's ``paramstyle``.

    Call it inside the producer's transaction, next to the business write it
    announces; Herald picks the row up after the transaction commits (Herald's own
    database, or an ``[[outbox.sources]]`` entry's).
    ``traceparent`` (the producer's current W3C trace context) continues its trace
    into the receivers; written as given, an invalid one is dropped by the relay with
    a warning, never the event. ``ordering_key``: a destination with ``ordering =
    "key"`` receives the events of one key one at a time, in order (docs/ordering.md);
    the table needs the ``ordering_key`` column (``herald outbox schema`` has it).
    Returns the event id.
    """
    validate_event_type(type)
    if (problem := reserved_type_problem(type)) is not None:
        raise ValueError(problem)
    if ordering_key is not None and (problem := ordering_key_problem(ordering_key)):
        raise ValueError(problem)
    event_id = id or new_id("evt_")
    if not event_id.startswith("evt_"):
        raise ValueError("event ids start with 'evt_'")
    driver, mark = _driver(conn)
    stamp = parse_timestamp(created_at) if created_at else None
    when = stamp.text if stamp else format_epoch(now())
    if driver in _MYSQL_DRIVERS:
        # MySQL's DATETIME takes neither the T nor the Z: the same UTC instant, its way.
        when = when.replace("T", " ").removesuffix("Z")
    columns = "id, tenant_id, type, data, created_at, traceparent"
    values: tuple[str | None, ...] = (
        event_id,
        tenant_id,
        type,
        orjson.dumps(data).decode(),
        when,
        traceparent,
    )
    if ordering_key is not None:  # (a table made before ordering may lack the column)
        columns += ", ordering_key"
        values += (ordering_key,)
    marks = ", ".join(mark.format(n=n) for n in range(1, len(values) + 1))
    cursor = conn.cursor()
    try:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", values)
    finally:
        cursor.close()
    return event_id
