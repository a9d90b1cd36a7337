"""PostgreSQL backend through asyncpg: a pool, row leases, ``SKIP LOCKED``, ``NOTIFY``.

Several Herald instances may share one database: outbox batches and due
deliveries are claimed with ``FOR UPDATE SKIP LOCKED``, and a claimed delivery
carries a lease (``lease_owner``, with ``next_attempt_at`` moved to the lease's
end), so no two instances attempt it at once and a killed instance's
deliveries come due again when the lease runs out. An insert trigger on the
outbox notifies the relays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from typing import Any

import asyncpg
import structlog

from herald.crypto import SecretBox
from herald.errors import Conflict, StorageError
from herald.model import (
    AttemptRecord,
    Delivery,
    DeliveryFilter,
    DeliveryKind,
    Destination,
    DestinationStatus,
    DueDelivery,
    Event,
    Instance,
    NewDelivery,
    OutboxRow,
    RelayPlan,
)
from herald.retry import retry_storage
from herald.store.base import (
    STALE_CATALOG,
    ApiKeyInfo,
    IdempotencyRecord,
    RelayProcessor,
    load_migrations,
)
from herald.store.rows import (
    ATTEMPT_COLUMNS,
    DELIVERY_COLUMNS,
    DESTINATION_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    NEW_DELIVERY_COLUMNS,
    attempt_from_row,
    attempt_to_row,
    delivery_from_row,
    destination_from_row,
    destination_to_row,
    event_from_row,
    instance_from_row,
    instance_to_row,
    new_delivery_rows,
    reencrypt_rows,
)

log = structlog.get_logger("herald.store")

NOTIFY_CHANNEL = "herald_outbox"
SESSION_SETTINGS = {"plan_cache_mode": "force_custom_plan"}
"""asyncpg prepares every statement. After five runs PostgreSQL may switch a prepared
statement to a generic plan, chosen with the statistics of the moment, and keep it:
one made while a table was nearly empty (a new database, before its first
autoanalyze) goes on scanning the whole table as it grows — the relay's
``id = ANY($1)`` on ``herald_events`` took 45 ms per batch at 30,000 events. Custom
plans see the parameters and the table's current size; planning Herald's short
statements costs far less than one such scan."""
# InternalClientError: a pooled connection the server terminated can fail its next
# statement with "cannot switch to state …" before the pool notices it is gone.
_DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    asyncio.TimeoutError,
)
# Outbox columns as the relay reads them; timestamps rendered the way SQLite stores them.
# Instants RFC 3339 cannot express keep a form the relay rejects: 'infinity' as such
# (to_char gives NULL), a BC date with its era (to_char gives the bare year).
_OUTBOX_SELECT = (
    "SELECT seq, convert_to(id, 'UTF8'), convert_to(tenant_id, 'UTF8'), convert_to(type, 'UTF8'),"
    " convert_to(data::text, 'UTF8'),"
    " convert_to(CASE WHEN NOT isfinite(created_at) THEN created_at::text"
    " ELSE to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
    " || CASE WHEN created_at < '0001-01-01T00:00:00Z' THEN ' BC' ELSE '' END END,"
    " 'UTF8') FROM herald_outbox"
)


def migrations() -> list[tuple[int, str, str]]:
    """The numbered migration scripts shipped with the package, in order."""
    return load_migrations("postgres")


def _wrap(exc: BaseException) -> StorageError:
    return StorageError(f"PostgreSQL: {type(exc).__name__}: {exc}")


class PostgresStore:
    """The backend for several instances sharing one database."""

    shared = True

    def __init__(self, dsn: str, *, box: SecretBox, pool_size: int = 10) -> None:
        self.dsn = dsn
        self._box = box
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_notify: Callable[[], None] | None = None
        self._relisten: asyncio.Task[None] | None = None
        self._closing = False

    # --- lifecycle ---------------------------------------------------------
    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self._pool_size,
                command_timeout=60,
                server_settings=SESSION_SETTINGS,
            )
            async with self._pool.acquire() as conn:
                await self._migrate(conn)
        except _DB_ERRORS as exc:
            await self.close()
            raise StorageError(f"cannot open PostgreSQL database: {exc}") from exc
        except BaseException:
            # E.g. a schema newer than this Herald: the pool must not outlive the failure.
            await self.close()
            raise

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            # One migrator at a time when several instances start together.
            await conn.execute("SELECT pg_advisory_xact_lock(7236520173)")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS herald_schema_migrations"
                " (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at double precision NOT NULL)"
            )
            done = {r[0] for r in await conn.fetch("SELECT version FROM herald_schema_migrations")}
            known = migrations()
            newest = max((v for v, _, _ in known), default=0)
            if done and max(done) > newest:
                raise StorageError(
                    f"database schema version {max(done)} is newer than this Herald"
                    f" ({newest}); upgrade Herald"
                )
            for version, name, script in known:
                if version in done:
                    continue
                await conn.execute(script)
                await conn.execute(
                    "INSERT INTO herald_schema_migrations VALUES ($1, $2, $3)",
                    version,
                    name,
                    time.time(),
                )

    async def close(self) -> None:
        self._closing = True
        if self._relisten is not None:
            self._relisten.cancel()
            with suppress(asyncio.CancelledError):
                await self._relisten
            self._relisten = None
        if self._listener is not None:
            with suppress(*_DB_ERRORS):
                await self._listener.close()
            self._listener = None
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), timeout=10)
            except (*_DB_ERRORS, TimeoutError):
                self._pool.terminate()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StorageError("the store is not open")
        return self._pool

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        try:
            return list(await self.pool.fetch(sql, *args))
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def ping(self) -> None:
        await self._fetch("SELECT value FROM herald_meta LIMIT 1")

    async def schema_version(self) -> int:
        rows = await self._fetch("SELECT MAX(version) FROM herald_schema_migrations")
        return int(rows[0][0] or 0)

    async def watch_outbox(self, callback: Callable[[], None]) -> bool:
        """LISTEN for outbox inserts on a dedicated connection; call ``callback`` on each.

        The connection is re-established whenever it is lost (a database restart, a
        terminated backend), with ``callback`` called once it is back, since
        notifications sent meanwhile are gone; until then the relay polls.
        """
        self._on_notify = callback
        try:
            await self._listen()
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc
        return True

    async def _listen(self) -> None:
        assert self._on_notify is not None
        notify = self._on_notify
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.add_listener(NOTIFY_CHANNEL, lambda *_: notify())
        except BaseException:
            with suppress(*_DB_ERRORS):
                await conn.close()
            raise
        conn.add_termination_listener(self._listener_lost)
        self._listener = conn

    def _listener_lost(self, conn: asyncpg.Connection) -> None:
        if self._closing or conn is not self._listener:
            return
        self._listener = None
        log.warning("outbox_listener_lost", retry="until it is back; the relay polls meanwhile")
        self._relisten = asyncio.get_running_loop().create_task(
            self._reconnect_listener(), name="herald-pg-relisten"
        )

    async def _reconnect_listener(self) -> None:
        async def listen() -> bool:
            if self._closing:
                return False
            try:
                await self._listen()
            except _DB_ERRORS as exc:
                raise _wrap(exc) from exc
            return True

        def trouble(exc: StorageError, delay: float) -> None:
            log.warning("outbox_listener_reconnect_failed", error=exc.message, retry_in=delay)

        await asyncio.sleep(0.2)
        if await retry_storage(listen, on_error=trouble, until=lambda: self._closing, first=0.4):
            log.info("outbox_listener_restored", channel=NOTIFY_CHANNEL)
            assert self._on_notify is not None
            self._on_notify()  # whatever was inserted while nobody listened

    # --- outbox ---------------------------------------------------------------
    async def relay(
        self, limit: int, process: RelayProcessor, *, destinations_version: int | None = None
    ) -> tuple[RelayPlan, int]:
        async with self._tx() as conn:
            if destinations_version is not None:
                current = await conn.fetchval(
                    "SELECT value FROM herald_meta WHERE key = 'destinations_version'"
                )
                if int(current) != destinations_version:
                    return RelayPlan(), STALE_CATALOG
            raw = await conn.fetch(
                f"{_OUTBOX_SELECT} ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED", limit
            )
            rows = [OutboxRow(r[0], *(None if v is None else bytes(v) for v in r[1:])) for r in raw]
            if not rows:
                return RelayPlan(), 0
            ids = [r.id.decode("utf-8", "replace") for r in rows if r.id is not None]
            existing = {
                r[0]
                for r in await conn.fetch("SELECT id FROM herald_events WHERE id = ANY($1)", ids)
            }
            plan = process(rows, existing)
            now = time.time()
            await self._insert_events(conn, plan.events, now)
            plan.leased = await self._insert_deliveries(conn, plan.deliveries, now)
            if plan.rejected:
                await conn.executemany(
                    "INSERT INTO herald_outbox_rejected"
                    " (seq, id, tenant_id, type, data, created_at, reason, rejected_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (seq) DO UPDATE"
                    " SET reason = EXCLUDED.reason, rejected_at = EXCLUDED.rejected_at",
                    [
                        (r.seq, r.id, r.tenant_id, r.type, r.data, r.created_at, r.reason, now)
                        for r in plan.rejected
                    ],
                )
            await conn.execute(
                "DELETE FROM herald_outbox WHERE seq = ANY($1)", [r.seq for r in rows]
            )
            return plan, len(rows)

    @staticmethod
    async def _insert_events(conn: asyncpg.Connection, events: Iterable[Event], now: float) -> None:
        rows = [
            (e.id, e.tenant_id, e.type, e.data.decode(), e.created_at, e.created_ts, now)
            for e in events
        ]
        if rows:
            # One statement for the batch: a row-by-row executemany costs a round
            # of parse, bind and execute messages per row.
            await conn.execute(
                "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts,"
                " ingested_at) SELECT * FROM unnest($1::text[], $2::text[], $3::text[],"
                " $4::text[], $5::text[], $6::float8[], $7::float8[])",
                *(list(column) for column in zip(*rows, strict=True)),
            )

    @staticmethod
    async def _insert_deliveries(
        conn: asyncpg.Connection, rows: Sequence[NewDelivery], now: float
    ) -> list[str]:
        """Store ``rows``; returns the ids stored leased (see :func:`new_delivery_rows`).

        ``FOR SHARE`` reads the destinations' committed statuses and keeps them until
        this transaction ends: an activation or a delete waits for it (and then sees
        these rows), or went first and is what this reads."""
        if not rows:
            return []
        dest_ids = list({d.destination_id for d in rows})
        statuses = {
            r[0]: r[1]
            for r in await conn.fetch(
                "SELECT id, status FROM herald_destinations"
                " WHERE id = ANY($1) AND deleted_at IS NULL ORDER BY id FOR SHARE",
                dest_ids,
            )
        }
        values, leased = new_delivery_rows(rows, statuses, now)
        if values:
            await conn.execute(
                f"INSERT INTO herald_deliveries ({NEW_DELIVERY_COLUMNS}, status, attempt_count,"
                " updated_at) SELECT *, 'pending', 0, t.created_at FROM unnest($1::text[],"
                " $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],"
                " $8::float8[], $9::int[], $10::float8[], $11::text[])"
                f" AS t({NEW_DELIVERY_COLUMNS})",
                *(list(column) for column in zip(*values, strict=True)),
            )
        return leased

    async def insert_outbox(
        self, *, id: str, tenant_id: str, type: str, data: bytes, created_at: str
    ) -> None:
        exists = Conflict(f"event {id} already exists", field="id", code="event_exists")
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                result = await conn.execute(
                    "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
                    " SELECT $1, $2, $3, $4::text::jsonb, $5::text::timestamptz WHERE NOT EXISTS"
                    " (SELECT 1 FROM herald_events WHERE id = $1)",
                    id,
                    tenant_id,
                    type,
                    data.decode(),
                    created_at,
                )
                # The relay may move an outbox row with this id to herald_events while
                # the INSERT runs: its NOT EXISTS read the older snapshot. A new
                # statement sees that commit; finding the event, roll back.
                if result.endswith(" 0") or await conn.fetchval(
                    "SELECT 1 FROM herald_events WHERE id = $1", id
                ):
                    raise exists
        except asyncpg.UniqueViolationError as exc:
            raise exists from exc
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def outbox_stats(self) -> tuple[int, float | None]:
        # '-infinity' is a timestamptz a producer can write: no epoch, no age.
        rows = await self._fetch(
            "SELECT COUNT(*), EXTRACT(EPOCH FROM MIN(created_at)"
            " FILTER (WHERE isfinite(created_at)))::float8 FROM herald_outbox"
        )
        count, oldest = rows[0]
        return int(count), None if oldest is None else float(oldest)

    async def list_rejected(self, *, limit: int) -> list[dict[str, object]]:
        rows = await self._fetch(
            "SELECT seq, id, tenant_id, type, data, created_at, reason, rejected_at"
            " FROM herald_outbox_rejected ORDER BY seq DESC LIMIT $1",
            limit,
        )
        return [dict(r) for r in rows]

    async def get_outbox_event(self, tenant_id: str, event_id: str) -> Event | None:
        rows = await self._fetch(
            f"{_OUTBOX_SELECT} WHERE id = $1 AND tenant_id = $2", event_id, tenant_id
        )
        if not rows:
            return None
        from herald.outbox import Reject, parse_row

        r = rows[0]
        try:
            return parse_row(
                OutboxRow(r[0], *(None if v is None else bytes(v) for v in r[1:])),
                max_payload_bytes=1 << 62,
            )
        except Reject:
            return None

    # --- dispatch ---------------------------------------------------------------
    async def claim_due(
        self,
        *,
        now: float,
        limit: int,
        owner: str,
        lease_until: float,
        exclude_destinations: Sequence[str] = (),
        due_since: float | None = None,
    ) -> list[DueDelivery]:
        since = "" if due_since is None else " AND next_attempt_at >= $6"
        async with self._tx() as conn:
            # The subquery's next_attempt_at is the old one: when each was due.
            claimed = await conn.fetch(
                "UPDATE herald_deliveries d SET lease_owner = $1, next_attempt_at = $2"
                " FROM (SELECT id, next_attempt_at FROM herald_deliveries"
                f"   WHERE status = 'pending' AND held = 0 AND next_attempt_at <= $3{since}"
                "   AND NOT (destination_id = ANY($4::text[]))"
                "   ORDER BY next_attempt_at LIMIT $5 FOR UPDATE SKIP LOCKED) s"
                " WHERE d.id = s.id"
                " RETURNING d.id, d.destination_id, d.kind, d.attempt_count, d.max_attempts,"
                " d.event_id, s.next_attempt_at",
                owner,
                lease_until,
                now,
                list(exclude_destinations),
                limit,
                *(() if due_since is None else (due_since,)),
            )
            if not claimed:
                return []
            events = {
                r[0]: event_from_row(r)
                for r in await conn.fetch(
                    f"SELECT {EVENT_COLUMNS} FROM herald_events WHERE id = ANY($1)",
                    list({r[5] for r in claimed}),
                )
            }
        return [
            DueDelivery(r[0], r[1], DeliveryKind(r[2]), r[3], r[4], events[r[5]], r[6])
            for r in claimed
        ]

    async def renew_leases(self, ids: Sequence[str], *, owner: str, until: float) -> int:
        if not ids:
            return 0
        try:
            result = await self.pool.execute(
                "UPDATE herald_deliveries SET next_attempt_at = $1"
                " WHERE id = ANY($2) AND lease_owner = $3 AND status = 'pending'",
                until,
                list(ids),
                owner,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc
        return int(result.split()[-1])

    async def record_attempts(self, records: Sequence[AttemptRecord]) -> None:
        if not records:
            return
        now = time.time()
        activating = sorted(
            {r.activates_destination for r in records if r.activates_destination is not None}
        )
        async with self._tx() as conn:
            if activating:
                # Lock order is destination, then its deliveries, as in delete and update:
                # activating after updating the deliveries would deadlock with them.
                await conn.execute(
                    "SELECT 1 FROM herald_destinations WHERE id = ANY($1::text[])"
                    " ORDER BY id FOR NO KEY UPDATE",
                    activating,
                )
            await conn.executemany(
                f"INSERT INTO herald_attempts ({ATTEMPT_COLUMNS})"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING",
                [attempt_to_row(r.attempt) for r in records],
            )
            await conn.executemany(
                "UPDATE herald_deliveries SET status = $1, attempt_count = $2,"
                " next_attempt_at = $3, lease_owner = NULL, updated_at = $4,"
                " last_attempt_id = $5 WHERE id = $6 AND status = 'pending'",
                [
                    (
                        r.status.value,
                        r.attempt.number,
                        r.next_attempt_at,
                        now,
                        r.attempt.id,
                        r.attempt.delivery_id,
                    )
                    for r in records
                ],
            )
            for r in records:
                if r.activates_destination is not None:
                    await self._activate_if_pending(
                        conn, r.activates_destination, r.attempt.delivery_id, now
                    )

    async def _activate_if_pending(
        self, conn: asyncpg.Connection, dest_id: str, delivery_id: str, now: float
    ) -> None:
        # Only the verification that is still the current one counts.
        result = await conn.execute(
            "UPDATE herald_destinations SET status = 'active',"
            " updated_at = GREATEST($1, updated_at + 0.000001)"
            " WHERE id = $2 AND status = 'pending_verification' AND deleted_at IS NULL"
            " AND EXISTS (SELECT 1 FROM herald_deliveries WHERE id = $3 AND status = 'success'"
            " AND kind = 'verification')"
            # ... and no later ping was sent (ids are time-ordered): an attempt still in
            # flight when the target changed must not verify the new target.
            " AND NOT EXISTS (SELECT 1 FROM herald_deliveries WHERE destination_id = $2"
            " AND kind = 'verification' AND id > $3)",
            now,
            dest_id,
            delivery_id,
        )
        if result.endswith(" 0"):
            return
        await self._set_held(conn, dest_id, held=False)
        await self._bump_version(conn)

    @staticmethod
    async def _set_held(conn: asyncpg.Connection, dest_id: str, *, held: bool) -> None:
        await conn.execute(
            "UPDATE herald_deliveries SET held = $1 WHERE destination_id = $2"
            " AND status = 'pending' AND kind = 'event' AND held = $3",
            int(held),
            dest_id,
            int(not held),
        )

    @staticmethod
    async def _bump_version(conn: asyncpg.Connection) -> None:
        await conn.execute(
            "UPDATE herald_meta SET value = value + 1 WHERE key = 'destinations_version'"
        )

    async def next_due_at(self) -> float | None:
        rows = await self._fetch(
            "SELECT MIN(next_attempt_at) FROM herald_deliveries"
            " WHERE status = 'pending' AND held = 0"
        )
        return None if rows[0][0] is None else float(rows[0][0])

    async def release_leases(self, *, owner: str | None, now: float) -> int:
        try:
            if owner is None:
                result = await self.pool.execute(
                    "UPDATE herald_deliveries SET next_attempt_at = $1, lease_owner = NULL"
                    " WHERE status = 'pending' AND lease_owner IS NOT NULL",
                    now,
                )
            else:
                result = await self.pool.execute(
                    "UPDATE herald_deliveries SET next_attempt_at = $1, lease_owner = NULL"
                    " WHERE status = 'pending' AND lease_owner = $2",
                    now,
                    owner,
                )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc
        return int(result.split()[-1])

    # --- instances ---------------------------------------------------------
    async def heartbeat(self, instance: Instance, *, now: float) -> bool:
        rows = await self._fetch(
            "INSERT INTO herald_instances AS i VALUES ($1, $2, $3, $4, $5, $6)"
            " ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at"
            " RETURNING (xmax <> 0)",  # xmax is set when the row was updated, not inserted
            *instance_to_row(instance, heartbeat_at=now),
        )
        return bool(rows[0][0])

    async def reap_instances(self, *, stale_before: float, now: float) -> dict[str, int]:
        async with self._tx() as conn:
            # Peers reaping at the same time wait on these row locks; one of them wins.
            dead = [
                r[0]
                for r in await conn.fetch(
                    "DELETE FROM herald_instances WHERE heartbeat_at < $1 RETURNING id",
                    stale_before,
                )
            ]
            if not dead:
                return {}
            released = await conn.fetch(
                "WITH leased AS (SELECT id, lease_owner FROM herald_deliveries"
                "   WHERE status = 'pending' AND lease_owner = ANY($2::text[]) FOR UPDATE)"
                " UPDATE herald_deliveries d SET next_attempt_at = $1, lease_owner = NULL"
                " FROM leased WHERE d.id = leased.id RETURNING leased.lease_owner",
                now,
                dead,
            )
        reaped = dict.fromkeys(dead, 0)
        for r in released:
            reaped[r[0]] += 1
        return reaped

    async def list_instances(self) -> list[Instance]:
        rows = await self._fetch(
            f"SELECT {INSTANCE_COLUMNS} FROM herald_instances ORDER BY started_at, id"
        )
        return [instance_from_row(r) for r in rows]

    async def remove_instance(self, instance_id: str) -> None:
        await self._fetch("DELETE FROM herald_instances WHERE id = $1", instance_id)

    async def delivery_counts(self, *, now: float) -> dict[str, int]:
        # Three range counts on the pending index rather than a GROUP BY on an
        # expression over every pending row.
        rows = await self._fetch(
            "SELECT (SELECT COUNT(*) FROM herald_deliveries"
            "   WHERE status = 'pending' AND held = 0 AND next_attempt_at <= $1),"
            " (SELECT COUNT(*) FROM herald_deliveries"
            "   WHERE status = 'pending' AND held = 0 AND next_attempt_at > $1),"
            " (SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending' AND held = 1)",
            now,
        )
        due, scheduled, held = (int(v) for v in rows[0])
        return {"due": due, "scheduled_retry": scheduled, "held": held}

    # --- destinations -----------------------------------------------------------
    async def destinations_version(self) -> int:
        rows = await self._fetch("SELECT value FROM herald_meta WHERE key = 'destinations_version'")
        return int(rows[0][0])

    async def destination_counts(self) -> list[tuple[str, str, int]]:
        rows = await self._fetch(
            "SELECT type, status, COUNT(*) FROM herald_destinations WHERE deleted_at IS NULL"
            " GROUP BY 1, 2"
        )
        return [(str(t), str(s), int(n)) for t, s, n in rows]

    async def all_destinations(self) -> list[Destination]:
        rows = await self._fetch(
            f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations WHERE deleted_at IS NULL"
        )
        return [destination_from_row(r, self._box) for r in rows]

    async def create_destination(
        self, dest: Destination, *, verification: tuple[Event, NewDelivery] | None
    ) -> None:
        row = destination_to_row(dest, self._box)
        async with self._tx() as conn:
            await conn.execute(
                f"INSERT INTO herald_destinations ({DESTINATION_COLUMNS})"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                *row,
            )
            if verification is not None:
                await self._insert_events(conn, [verification[0]], dest.created_at)
                await self._insert_deliveries(conn, [verification[1]], dest.created_at)
            await self._bump_version(conn)

    async def update_destination(
        self,
        dest: Destination,
        *,
        verification: tuple[Event, NewDelivery] | None = None,
        expected_updated_at: float | None = None,
    ) -> bool:
        row = destination_to_row(dest, self._box)
        async with self._tx() as conn:
            result = await conn.execute(
                "UPDATE herald_destinations SET name = $1, type = $2, config = $3, secrets = $4,"
                " events = $5, status = $6, updated_at = $7 WHERE id = $8 AND deleted_at IS NULL"
                " AND ($9::float8 IS NULL OR updated_at = $9)",
                row[2],
                row[3],
                row[4],
                row[5],
                row[6],
                row[7],
                row[9],
                row[0],
                expected_updated_at,
            )
            if result.endswith(" 0"):
                return False
            await self._set_held(conn, dest.id, held=dest.status != DestinationStatus.ACTIVE)
            if verification is not None:
                await conn.execute(
                    "UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL,"
                    " lease_owner = NULL, updated_at = $1 WHERE destination_id = $2"
                    " AND kind = 'verification' AND status = 'pending'",
                    dest.updated_at,
                    dest.id,
                )
                await self._insert_events(conn, [verification[0]], dest.updated_at)
                await self._insert_deliveries(conn, [verification[1]], dest.updated_at)
            await self._bump_version(conn)
            return True

    async def get_destination(self, tenant_id: str | None, dest_id: str) -> Destination | None:
        rows = await self._fetch(
            f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations"
            " WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)",
            dest_id,
            tenant_id,
        )
        return destination_from_row(rows[0], self._box) if rows else None

    async def list_destinations(
        self,
        *,
        tenant_id: str,
        status: DestinationStatus | None,
        type: str | None,
        before_id: str | None,
        limit: int,
    ) -> list[Destination]:
        rows = await self._fetch(
            f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations"
            " WHERE tenant_id = $1 AND deleted_at IS NULL"
            " AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR type = $3)"
            " AND ($4::text IS NULL OR id < $4) ORDER BY id DESC LIMIT $5",
            tenant_id,
            None if status is None else status.value,
            type,
            before_id,
            limit,
        )
        return [destination_from_row(r, self._box) for r in rows]

    async def delete_destination(self, tenant_id: str, dest_id: str, *, now: float) -> bool:
        async with self._tx() as conn:
            result = await conn.execute(
                "UPDATE herald_destinations SET deleted_at = $1, updated_at = $1"
                " WHERE id = $2 AND tenant_id = $3 AND deleted_at IS NULL",
                now,
                dest_id,
                tenant_id,
            )
            if result.endswith(" 0"):
                return False
            await conn.execute(
                "UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL,"
                " lease_owner = NULL, updated_at = $1 WHERE destination_id = $2"
                " AND status = 'pending'",
                now,
                dest_id,
            )
            await self._bump_version(conn)
            return True

    # --- deliveries and events ------------------------------------------------------
    async def insert_deliveries(
        self, events: Sequence[Event], deliveries: Sequence[NewDelivery]
    ) -> None:
        async with self._tx() as conn:
            now = time.time()
            await self._insert_events(conn, events, now)
            await self._insert_deliveries(conn, deliveries, now)

    async def get_delivery(
        self, tenant_id: str | None, delivery_id: str, *, with_attempts: bool
    ) -> Delivery | None:
        rows = await self._fetch(
            f"SELECT {DELIVERY_COLUMNS} FROM herald_deliveries d"
            " LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id"
            " WHERE d.id = $1 AND ($2::text IS NULL OR d.tenant_id = $2)",
            delivery_id,
            tenant_id,
        )
        if not rows:
            return None
        delivery = delivery_from_row(rows[0])
        if not with_attempts:
            return delivery
        attempts = await self._fetch(
            f"SELECT {ATTEMPT_COLUMNS} FROM herald_attempts WHERE delivery_id = $1"
            " ORDER BY number, started_at",
            delivery_id,
        )
        return replace(delivery, attempts=tuple(attempt_from_row(a) for a in attempts))

    @staticmethod
    def _filter_sql(flt: DeliveryFilter, params: list[Any]) -> str:
        clauses: list[str] = []

        def arg(value: Any) -> str:
            params.append(value)
            return f"${len(params)}"

        if flt.tenant_id is not None:
            clauses.append(f"d.tenant_id = {arg(flt.tenant_id)}")
        if flt.destination_id is not None:
            clauses.append(f"d.destination_id = {arg(flt.destination_id)}")
        if flt.status is not None:
            clauses.append(f"d.status = {arg(flt.status.value)}")
        if flt.event_types:
            clauses.append(f"d.event_type = ANY({arg(list(flt.event_types))})")
        if flt.since is not None:
            clauses.append(f"d.created_at >= {arg(flt.since)}")
        if flt.until is not None:
            clauses.append(f"d.created_at < {arg(flt.until)}")
        if flt.ids:
            clauses.append(f"d.id = ANY({arg(list(flt.ids))})")
        if flt.kind is not None:
            clauses.append(f"d.kind = {arg(flt.kind.value)}")
        return " AND ".join(clauses) or "TRUE"

    async def list_deliveries(
        self, flt: DeliveryFilter, *, before_id: str | None, limit: int
    ) -> list[Delivery]:
        params: list[Any] = []
        where = self._filter_sql(flt, params)
        if before_id is not None:
            params.append(before_id)
            where += f" AND d.id < ${len(params)}"
        params.append(limit)
        rows = await self._fetch(
            f"SELECT {DELIVERY_COLUMNS} FROM herald_deliveries d"
            f" LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id WHERE {where}"
            f" ORDER BY d.id DESC LIMIT ${len(params)}",
            *params,
        )
        return [delivery_from_row(r) for r in rows]

    async def count_deliveries(self, flt: DeliveryFilter) -> int:
        params: list[Any] = []
        where = self._filter_sql(flt, params)
        rows = await self._fetch(f"SELECT COUNT(*) FROM herald_deliveries d WHERE {where}", *params)
        return int(rows[0][0])

    async def requeue(self, ids: Sequence[str], *, now: float, max_retries: int) -> int:
        if not ids:
            return 0
        async with self._tx() as conn:
            result = await conn.execute(
                "UPDATE herald_deliveries d SET"
                " max_attempts = CASE WHEN d.status = 'pending' THEN d.max_attempts"
                "   ELSE d.attempt_count + $1 END,"
                " status = 'pending', next_attempt_at = $2, lease_owner = NULL, updated_at = $2,"
                " held = CASE WHEN t.status = 'active' THEN 0 ELSE 1 END"
                " FROM herald_destinations t"
                " WHERE t.id = d.destination_id AND t.deleted_at IS NULL"
                " AND d.id = ANY($3) AND d.kind = 'event' AND d.lease_owner IS NULL",
                max_retries + 1,
                now,
                list(ids),
            )
        return int(result.split()[-1])

    async def get_event(self, tenant_id: str | None, event_id: str) -> Event | None:
        rows = await self._fetch(
            f"SELECT {EVENT_COLUMNS} FROM herald_events"
            " WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)",
            event_id,
            tenant_id,
        )
        return event_from_row(rows[0]) if rows else None

    # --- idempotency ------------------------------------------------------------
    async def count_request(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        try:
            if expire:
                await self.pool.execute(
                    "DELETE FROM herald_rate_limits WHERE window_no < $1", window_no
                )
            count = await self.pool.fetchval(
                "INSERT INTO herald_rate_limits (tenant_id, window_no, count) VALUES ($1, $2, 1)"
                " ON CONFLICT (tenant_id, window_no)"
                " DO UPDATE SET count = herald_rate_limits.count + 1 RETURNING count",
                tenant_id,
                window_no,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc
        return int(count)

    async def idempotency_begin(
        self, *, tenant_id: str, key: str, fingerprint: str, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        async with self._tx() as conn:
            await conn.execute("DELETE FROM herald_idempotency WHERE created_at < $1", now - ttl)
            inserted = await conn.fetchval(
                "INSERT INTO herald_idempotency (tenant_id, key, fingerprint, created_at)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1",
                tenant_id,
                key,
                fingerprint,
                now,
            )
            if inserted:
                return None
            row = await conn.fetchrow(
                "SELECT fingerprint, status, body FROM herald_idempotency"
                " WHERE tenant_id = $1 AND key = $2",
                tenant_id,
                key,
            )
        if row is None:  # expired and deleted between the two statements
            return None
        return IdempotencyRecord(row[0], row[1], None if row[2] is None else bytes(row[2]))

    async def idempotency_finish(
        self, *, tenant_id: str, key: str, status: int, body: bytes
    ) -> None:
        try:
            await self.pool.execute(
                "UPDATE herald_idempotency SET status = $1, body = $2"
                " WHERE tenant_id = $3 AND key = $4",
                status,
                body,
                tenant_id,
                key,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def idempotency_abort(self, *, tenant_id: str, key: str) -> None:
        try:
            await self.pool.execute(
                "DELETE FROM herald_idempotency WHERE tenant_id = $1 AND key = $2"
                " AND status IS NULL",
                tenant_id,
                key,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def purge(self, *, before: float, limit: int) -> int:
        async with self._tx() as conn:
            ids = [
                r[0]
                for r in await conn.fetch(
                    "SELECT id FROM herald_deliveries WHERE status <> 'pending'"
                    " AND updated_at < $1 ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                    before,
                    limit,
                )
            ]
            if ids:
                await conn.execute("DELETE FROM herald_attempts WHERE delivery_id = ANY($1)", ids)
                gone = await conn.fetch(
                    "DELETE FROM herald_deliveries WHERE id = ANY($1) RETURNING event_id", ids
                )
                # The events of the deliveries just deleted, unless another still uses
                # them: index probes. (A NOT EXISTS over all old events was planned as a
                # hash anti-join of both whole tables: 1.3 s a batch at 1 M rows.)
                await conn.execute(
                    "DELETE FROM herald_events e WHERE e.id = ANY($1) AND e.ingested_at < $2"
                    " AND NOT EXISTS (SELECT 1 FROM herald_deliveries d WHERE d.event_id = e.id)",
                    list({r[0] for r in gone}),
                    before,
                )
            if len(ids) < limit:
                # Then events that never had a delivery (no subscriber), oldest first,
                # each probed on its own; the row estimate is poor, and JIT only costs.
                await conn.execute("SET LOCAL jit = off")
                await conn.execute(
                    "DELETE FROM herald_events WHERE id IN (SELECT e.id FROM herald_events e"
                    " WHERE e.ingested_at < $1 AND (SELECT 1 FROM herald_deliveries d"
                    " WHERE d.event_id = e.id LIMIT 1) IS NULL ORDER BY e.ingested_at LIMIT $2)",
                    before,
                    limit,
                )
            await conn.execute(
                "DELETE FROM herald_outbox_rejected WHERE seq IN (SELECT seq FROM"
                " herald_outbox_rejected WHERE rejected_at < $1 LIMIT $2)",
                before,
                limit,
            )
            return len(ids)

    # --- API keys -------------------------------------------------------------------
    async def create_api_key(self, *, key_hash: str, tenant_id: str, hint: str, now: float) -> None:
        try:
            await self.pool.execute(
                "INSERT INTO herald_api_keys (hash, tenant_id, hint, created_at)"
                " VALUES ($1, $2, $3, $4)",
                key_hash,
                tenant_id,
                hint,
                now,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc

    async def tenant_for_key(self, key_hash: str) -> str | None:
        rows = await self._fetch(
            "SELECT tenant_id FROM herald_api_keys WHERE hash = $1 AND revoked_at IS NULL",
            key_hash,
        )
        return str(rows[0][0]) if rows else None

    async def list_api_keys(self, tenant_id: str) -> list[ApiKeyInfo]:
        rows = await self._fetch(
            "SELECT hash, tenant_id, hint, created_at, revoked_at FROM herald_api_keys"
            " WHERE tenant_id = $1 ORDER BY created_at DESC, hash",
            tenant_id,
        )
        return [ApiKeyInfo(*row) for row in rows]

    async def revoke_api_keys(self, *, tenant_id: str, hash_prefix: str, now: float) -> int:
        try:
            status = await self.pool.execute(
                "UPDATE herald_api_keys SET revoked_at = $1"
                " WHERE tenant_id = $2 AND left(hash, $3) = $4 AND revoked_at IS NULL",
                now,
                tenant_id,
                len(hash_prefix),
                hash_prefix,
            )
        except _DB_ERRORS as exc:
            raise _wrap(exc) from exc
        return int(status.rpartition(" ")[2])

    # --- key rotation -----------------------------------------------------------------
    async def reencrypt_secrets(
        self, *, after_id: str | None, limit: int
    ) -> tuple[int, int, str | None]:
        async with self._tx() as conn:
            # FOR UPDATE: a concurrent update of one of these rows waits for this batch.
            rows = await conn.fetch(
                "SELECT id, secrets FROM herald_destinations WHERE id > $1"
                " ORDER BY id LIMIT $2 FOR UPDATE",
                after_id or "",
                limit,
            )
            changed = reencrypt_rows([tuple(r) for r in rows], self._box)
            if changed:
                await conn.executemany(
                    "UPDATE herald_destinations SET secrets = $1 WHERE id = $2", changed
                )
        return len(rows), len(changed), (str(rows[-1][0]) if rows else None)
