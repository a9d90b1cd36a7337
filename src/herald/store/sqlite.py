"""SQLite backend through aiosqlite: WAL mode, one writer connection, one reader.

SQLite allows one writer at a time, so every write goes through a single
connection and each write operation is one short ``BEGIN IMMEDIATE``
transaction; the API reads on a second connection, which WAL lets run beside it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiosqlite
import tenacity

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
from herald.timeutil import parse_timestamp


def migrations() -> list[tuple[int, str, str]]:
    """The numbered migration scripts shipped with the package, in order."""
    return load_migrations("sqlite")


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


class SQLiteStore:
    """The embedded default backend."""

    shared = False

    def __init__(self, path: Path, *, box: SecretBox, busy_timeout: float = 5.0) -> None:
        self.path = path
        self._box = box
        self._busy_ms = int(busy_timeout * 1000)
        self._w: aiosqlite.Connection | None = None
        self._r: aiosqlite.Connection | None = None
        # The gauges' counts (``herald_deliveries_pending`` and the like) take 0.1 s at
        # a million scheduled retries: on their own connection, so the claims and the
        # relay's catalog checks on the reader never queue behind them.
        self._g: aiosqlite.Connection | None = None
        # One connection writes; the relay, the workers and the API take turns.
        self._write_lock = asyncio.Lock()
        # After a relay pass that found the outbox empty, the next one first looks
        # with a read (no lock in WAL mode) and takes the write lock only when there
        # are rows: an idle relay polls often, and must not hold up a producer's
        # transaction 50 times a second.
        self._outbox_idle = False

    # --- lifecycle --------------------------------------------------------
    async def open(self) -> None:
        # Switching a new file to WAL takes an exclusive lock that SQLite does not
        # wait for, so processes opening the same new file at once retry briefly.
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(_is_locked),
            stop=tenacity.stop_after_delay(max(self._busy_ms / 1000, 1.0)),
            wait=tenacity.wait_random_exponential(multiplier=0.01, max=0.25),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._open_once()
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(
                f"cannot open SQLite database {self.path}: {exc}{_filesystem_hint(self.path)}"
            ) from exc

    async def _open_once(self) -> None:
        try:
            if self.path.parent != Path():
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._w = await self._connect()
            await self._w.execute("PRAGMA journal_mode=WAL")
            await self._migrate(self._w)
            self._r = await self._connect()
            self._g = await self._connect()
        except BaseException:
            await self.close()
            raise

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            # NORMAL in WAL mode survives a process crash; only an OS crash can drop
            # the last commits, which at-least-once redelivery then covers.
            await conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            # SQLite opens the file lazily, so a read-only or missing directory fails
            # here; the connection's worker thread must not keep the process alive.
            with suppress(sqlite3.Error, ValueError):
                await conn.close()
            raise
        return conn

    async def close(self) -> None:
        for conn in (self._g, self._r, self._w):
            if conn is not None:
                with suppress(sqlite3.Error, ValueError):
                    await conn.close()
        self._g = self._r = self._w = None

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        # Everything, the bookkeeping table included, under the write lock: two
        # processes opening a new file at once must queue, not fail with "locked".
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.execute(
                "CREATE TABLE IF NOT EXISTS herald_schema_migrations"
                " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            async with db.execute("SELECT version FROM herald_schema_migrations") as cur:
                done = {row[0] for row in await cur.fetchall()}
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
                for statement in _split_sql(script):
                    await db.execute(statement)
                await db.execute(
                    "INSERT INTO herald_schema_migrations VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    @property
    def _writer(self) -> aiosqlite.Connection:
        if self._w is None:
            raise StorageError("the store is not open")
        return self._w

    @property
    def _reader(self) -> aiosqlite.Connection:
        if self._r is None:
            raise StorageError("the store is not open")
        return self._r

    @property
    def _gauges(self) -> aiosqlite.Connection:
        if self._g is None:
            raise StorageError("the store is not open")
        return self._g

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._write_lock, self._tx_unlocked() as db:
            yield db

    @asynccontextmanager
    async def _tx_unlocked(self) -> AsyncIterator[aiosqlite.Connection]:
        db = self._writer
        try:
            await db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc
        try:
            yield db
        except BaseException:
            with suppress(sqlite3.Error):
                await db.execute("ROLLBACK")
            raise
        try:
            await db.execute("COMMIT")
        except sqlite3.Error as exc:
            # SQLite may already have rolled back (SQLITE_FULL does): keep its error,
            # not "cannot rollback - no transaction is active".
            with suppress(sqlite3.Error):
                await db.execute("ROLLBACK")
            raise StorageError(f"SQLite: {exc}") from exc

    async def _fetchall(
        self, sql: str, params: Sequence[Any] = (), *, db: aiosqlite.Connection | None = None
    ) -> list[Any]:
        try:
            async with (db or self._reader).execute(sql, params) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def ping(self) -> None:
        """A real read, and proof that the write lock can be taken."""
        await self._fetchall("SELECT value FROM herald_meta LIMIT 1")
        async with self._tx():
            pass

    async def schema_version(self) -> int:
        rows = await self._fetchall("SELECT MAX(version) FROM herald_schema_migrations")
        return int(rows[0][0] or 0)

    # --- outbox -----------------------------------------------------------
    async def relay(
        self, limit: int, process: RelayProcessor, *, destinations_version: int | None = None
    ) -> tuple[RelayPlan, int]:
        try:
            if self._outbox_idle and not await self._fetchall(
                "SELECT 1 FROM herald_outbox LIMIT 1"
            ):
                return RelayPlan(), 0
            self._outbox_idle = False
            async with self._tx() as db:
                if destinations_version is not None:
                    current = await self._fetchall(
                        "SELECT value FROM herald_meta WHERE key = 'destinations_version'", db=db
                    )
                    if int(current[0][0]) != destinations_version:
                        return RelayPlan(), STALE_CATALOG
                # Text columns are read as bytes: a producer can store invalid UTF-8,
                # and one undecodable row must not fail the whole batch.
                async with db.execute(
                    "SELECT seq, CAST(id AS BLOB), CAST(tenant_id AS BLOB), CAST(type AS BLOB),"
                    " CAST(data AS BLOB), CAST(created_at AS BLOB)"
                    " FROM herald_outbox ORDER BY seq LIMIT ?",
                    (limit,),
                ) as cur:
                    rows = [OutboxRow(*r) for r in await cur.fetchall()]
                if not rows:
                    self._outbox_idle = True
                    return RelayPlan(), 0
                ids = [r.id.decode("utf-8", "replace") for r in rows if r.id is not None]
                existing = {
                    row[0]
                    for row in await self._fetchall(
                        f"SELECT id FROM herald_events WHERE id IN ({_placeholders(len(ids))})",
                        ids,
                        db=db,
                    )
                }
                plan = process(rows, existing)
                now = time.time()
                await self._insert_events(db, plan.events, now)
                plan.leased = await self._insert_deliveries(db, plan.deliveries, now)
                if plan.rejected:
                    await db.executemany(
                        "INSERT OR REPLACE INTO herald_outbox_rejected"
                        " (seq, id, tenant_id, type, data, created_at, reason, rejected_at)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [
                            (r.seq, r.id, r.tenant_id, r.type, r.data, r.created_at, r.reason, now)
                            for r in plan.rejected
                        ],
                    )
                await db.execute(
                    "DELETE FROM herald_outbox WHERE seq BETWEEN ? AND ?",
                    (rows[0].seq, rows[-1].seq),
                )
                return plan, len(rows)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    @staticmethod
    async def _insert_events(db: aiosqlite.Connection, events: Iterable[Event], now: float) -> None:
        await db.executemany(
            "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts,"
            " ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (e.id, e.tenant_id, e.type, e.data.decode(), e.created_at, e.created_ts, now)
                for e in events
            ],
        )

    async def _insert_deliveries(
        self, db: aiosqlite.Connection, rows: Sequence[NewDelivery], now: float
    ) -> list[str]:
        """Store ``rows``; returns the ids stored leased (see :func:`new_delivery_rows`).
        The statuses are read once per call, inside the caller's write transaction."""
        if not rows:
            return []
        dest_ids = list({d.destination_id for d in rows})
        statuses: dict[str, str] = dict(
            await self._fetchall(
                "SELECT id, status FROM herald_destinations WHERE deleted_at IS NULL"
                f" AND id IN ({_placeholders(len(dest_ids))})",
                dest_ids,
                db=db,
            )
        )
        values, leased = new_delivery_rows(rows, statuses, now)
        await db.executemany(
            f"INSERT INTO herald_deliveries ({NEW_DELIVERY_COLUMNS}, status, attempt_count,"
            " updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'pending', 0, ?10)",
            values,
        )
        return leased

    async def insert_outbox(
        self, *, id: str, tenant_id: str, type: str, data: bytes, created_at: str
    ) -> None:
        try:
            async with self._tx() as db:
                # One check under the write lock: not waiting in the outbox (UNIQUE)
                # and not already relayed into an event.
                cur = await db.execute(
                    "INSERT INTO herald_outbox (id, tenant_id, type, data, created_at)"
                    " SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS"
                    " (SELECT 1 FROM herald_events WHERE id = ?)",
                    (id, tenant_id, type, data.decode(), created_at, id),
                )
                if not cur.rowcount:
                    raise Conflict(f"event {id} already exists", field="id", code="event_exists")
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"event {id} already exists", field="id", code="event_exists") from exc
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def outbox_stats(self) -> tuple[int, float | None]:
        rows = await self._fetchall(
            "SELECT COUNT(*), (SELECT CAST(created_at AS BLOB) FROM herald_outbox"
            " ORDER BY seq LIMIT 1) FROM herald_outbox",
            db=self._gauges,
        )
        count, oldest = rows[0]
        if oldest is None:
            return int(count), None
        try:
            # A poison row can hold any bytes until the relay moves it out.
            return int(count), parse_timestamp(bytes(oldest).decode("utf-8", "replace")).epoch
        except ValueError:
            return int(count), None

    async def list_rejected(self, *, limit: int) -> list[dict[str, object]]:
        rows = await self._fetchall(
            "SELECT seq, id, tenant_id, type, data, created_at, reason, rejected_at"
            " FROM herald_outbox_rejected ORDER BY seq DESC LIMIT ?",
            (limit,),
        )
        keys = ("seq", "id", "tenant_id", "type", "data", "created_at", "reason", "rejected_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    # --- dispatch ---------------------------------------------------------
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
        where = "status = 'pending' AND held = 0 AND next_attempt_at <= ?"
        params: list[Any] = [now]
        if due_since is not None:
            where += " AND next_attempt_at >= ?"
            params.append(due_since)
        if exclude_destinations:
            where += f" AND destination_id NOT IN ({_placeholders(len(exclude_destinations))})"
            params.extend(exclude_destinations)
        try:
            async with self._tx() as db:
                # Selected, then leased: RETURNING would give the new next_attempt_at,
                # and the caller wants when each was due.
                claimed = await self._fetchall(
                    "SELECT id, destination_id, kind, attempt_count, max_attempts, event_id,"
                    f" next_attempt_at FROM herald_deliveries WHERE {where}"
                    " ORDER BY next_attempt_at LIMIT ?",
                    (*params, limit),
                    db=db,
                )
                if not claimed:
                    return []
                await db.execute(
                    "UPDATE herald_deliveries SET lease_owner = ?, next_attempt_at = ?"
                    f" WHERE id IN ({_placeholders(len(claimed))})",
                    (owner, lease_until, *(row[0] for row in claimed)),
                )
                event_ids = list({row[5] for row in claimed})
                events = {
                    row[0]: event_from_row(row)
                    for row in await self._fetchall(
                        f"SELECT {EVENT_COLUMNS} FROM herald_events"
                        f" WHERE id IN ({_placeholders(len(event_ids))})",
                        event_ids,
                        db=db,
                    )
                }
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc
        return [
            DueDelivery(
                id=row[0],
                destination_id=row[1],
                kind=DeliveryKind(row[2]),
                attempt_count=row[3],
                max_attempts=row[4],
                event=events[row[5]],
                due_at=row[6],
            )
            for row in claimed
        ]

    async def renew_leases(self, ids: Sequence[str], *, owner: str, until: float) -> int:
        if not ids:
            return 0
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_deliveries SET next_attempt_at = ?"
                    f" WHERE id IN ({_placeholders(len(ids))}) AND lease_owner = ?"
                    " AND status = 'pending'",
                    (until, *ids, owner),
                )
                return cur.rowcount
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def watch_outbox(self, callback: Callable[[], None]) -> bool:
        # SQLite has no notifications across processes; the relay polls.
        return False

    async def record_attempts(self, records: Sequence[AttemptRecord]) -> None:
        if not records:
            return
        now = time.time()
        try:
            async with self._tx() as db:
                await db.executemany(
                    f"INSERT INTO herald_attempts ({ATTEMPT_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [attempt_to_row(r.attempt) for r in records],
                )
                # Only a still-pending delivery moves on: one deleted meanwhile
                # keeps its final state, but its attempt stays on record.
                await db.executemany(
                    "UPDATE herald_deliveries SET status = ?, attempt_count = ?,"
                    " next_attempt_at = ?, lease_owner = NULL, updated_at = ?,"
                    " last_attempt_id = ? WHERE id = ? AND status = 'pending'",
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
                            db, r.activates_destination, r.attempt.delivery_id, now
                        )
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def _activate_if_pending(
        self, db: aiosqlite.Connection, dest_id: str, delivery_id: str, now: float
    ) -> None:
        # Only the verification that is still the current one counts: a ping
        # superseded by a target change (marked failure) must not activate.
        cur = await db.execute(
            "UPDATE herald_destinations SET status = 'active',"
            " updated_at = MAX(?, updated_at + 0.000001)"
            " WHERE id = ? AND status = 'pending_verification' AND deleted_at IS NULL"
            " AND EXISTS (SELECT 1 FROM herald_deliveries WHERE id = ? AND status = 'success'"
            " AND kind = 'verification')"
            # ... and no later ping was sent (ids are time-ordered): an attempt still in
            # flight when the target changed must not verify the new target.
            " AND NOT EXISTS (SELECT 1 FROM herald_deliveries WHERE destination_id = ?"
            " AND kind = 'verification' AND id > ?)",
            (now, dest_id, delivery_id, dest_id, delivery_id),
        )
        if cur.rowcount:
            await self._set_held(db, dest_id, held=False)
            await self._bump_version(db)

    @staticmethod
    async def _set_held(db: aiosqlite.Connection, dest_id: str, *, held: bool) -> None:
        await db.execute(
            "UPDATE herald_deliveries SET held = ? WHERE destination_id = ?"
            " AND status = 'pending' AND kind = 'event' AND held = ?",
            (int(held), dest_id, int(not held)),
        )

    @staticmethod
    async def _bump_version(db: aiosqlite.Connection) -> None:
        await db.execute(
            "UPDATE herald_meta SET value = value + 1 WHERE key = 'destinations_version'"
        )

    async def next_due_at(self) -> float | None:
        rows = await self._fetchall(
            "SELECT MIN(next_attempt_at) FROM herald_deliveries"
            " WHERE status = 'pending' AND held = 0",
        )
        value = rows[0][0]
        return None if value is None else float(value)

    async def release_leases(self, *, owner: str | None, now: float) -> int:
        where = "lease_owner IS NOT NULL" if owner is None else "lease_owner = ?"
        params: tuple[Any, ...] = (now,) if owner is None else (now, owner)
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_deliveries SET next_attempt_at = ?, lease_owner = NULL"
                    f" WHERE status = 'pending' AND {where}",
                    params,
                )
                return cur.rowcount
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    # --- instances ---------------------------------------------------------
    async def heartbeat(self, instance: Instance, *, now: float) -> bool:
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_instances SET heartbeat_at = ? WHERE id = ?", (now, instance.id)
                )
                if cur.rowcount:
                    return True
                await db.execute(
                    "INSERT INTO herald_instances VALUES (?, ?, ?, ?, ?, ?)",
                    instance_to_row(instance, heartbeat_at=now),
                )
                return False
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def reap_instances(self, *, stale_before: float, now: float) -> dict[str, int]:
        try:
            async with self._tx() as db:
                async with db.execute(
                    "SELECT id FROM herald_instances WHERE heartbeat_at < ?", (stale_before,)
                ) as cur:
                    dead = [r[0] for r in await cur.fetchall()]
                reaped: dict[str, int] = {}
                for instance_id in dead:
                    cur = await db.execute(
                        "UPDATE herald_deliveries SET next_attempt_at = ?, lease_owner = NULL"
                        " WHERE status = 'pending' AND lease_owner = ?",
                        (now, instance_id),
                    )
                    reaped[instance_id] = cur.rowcount
                    await db.execute("DELETE FROM herald_instances WHERE id = ?", (instance_id,))
                return reaped
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def list_instances(self) -> list[Instance]:
        rows = await self._fetchall(
            f"SELECT {INSTANCE_COLUMNS} FROM herald_instances ORDER BY started_at, id"
        )
        return [instance_from_row(r) for r in rows]

    async def remove_instance(self, instance_id: str) -> None:
        try:
            async with self._tx() as db:
                await db.execute("DELETE FROM herald_instances WHERE id = ?", (instance_id,))
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def delivery_counts(self, *, now: float) -> dict[str, int]:
        # Three range counts on the pending index: a GROUP BY on an expression took
        # 0.8 s at 1 M scheduled retries. On the gauges' own connection (see __init__).
        rows = await self._fetchall(
            "SELECT (SELECT COUNT(*) FROM herald_deliveries"
            "   WHERE status = 'pending' AND held = 0 AND next_attempt_at <= ?),"
            " (SELECT COUNT(*) FROM herald_deliveries"
            "   WHERE status = 'pending' AND held = 0 AND next_attempt_at > ?),"
            " (SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending' AND held = 1)",
            (now, now),
            db=self._gauges,
        )
        due, scheduled, held = (int(v) for v in rows[0])
        return {"due": due, "scheduled_retry": scheduled, "held": held}

    # --- destinations -----------------------------------------------------
    async def destinations_version(self) -> int:
        rows = await self._fetchall(
            "SELECT value FROM herald_meta WHERE key = 'destinations_version'",
        )
        return int(rows[0][0])

    async def destination_counts(self) -> list[tuple[str, str, int]]:
        rows = await self._fetchall(
            "SELECT type, status, COUNT(*) FROM herald_destinations WHERE deleted_at IS NULL"
            " GROUP BY 1, 2",
            db=self._gauges,
        )
        return [(str(t), str(s), int(n)) for t, s, n in rows]

    async def all_destinations(self) -> list[Destination]:
        rows = await self._fetchall(
            f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations WHERE deleted_at IS NULL",
        )
        return [destination_from_row(row, self._box) for row in rows]

    async def create_destination(
        self, dest: Destination, *, verification: tuple[Event, NewDelivery] | None
    ) -> None:
        row = destination_to_row(dest, self._box)
        try:
            async with self._tx() as db:
                await db.execute(
                    f"INSERT INTO herald_destinations ({DESTINATION_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                if verification is not None:
                    await self._insert_events(db, [verification[0]], dest.created_at)
                    await self._insert_deliveries(db, [verification[1]], dest.created_at)
                await self._bump_version(db)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def update_destination(
        self,
        dest: Destination,
        *,
        verification: tuple[Event, NewDelivery] | None = None,
        expected_updated_at: float | None = None,
    ) -> bool:
        row = destination_to_row(dest, self._box)
        guard = ""
        params: tuple[float, ...] = ()
        if expected_updated_at is not None:
            guard, params = " AND updated_at = ?", (expected_updated_at,)
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_destinations SET name = ?, type = ?, config = ?, secrets = ?,"
                    " events = ?, status = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL"
                    + guard,
                    (row[2], row[3], row[4], row[5], row[6], row[7], row[9], row[0], *params),
                )
                if not cur.rowcount:
                    return False
                await self._set_held(db, dest.id, held=dest.status != DestinationStatus.ACTIVE)
                if verification is not None:
                    await db.execute(
                        "UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL,"
                        " lease_owner = NULL, updated_at = ? WHERE destination_id = ?"
                        " AND kind = 'verification' AND status = 'pending'",
                        (dest.updated_at, dest.id),
                    )
                    await self._insert_events(db, [verification[0]], dest.updated_at)
                    await self._insert_deliveries(db, [verification[1]], dest.updated_at)
                await self._bump_version(db)
                return True
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def get_destination(self, tenant_id: str | None, dest_id: str) -> Destination | None:
        sql = f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations WHERE id = ?"
        params: list[Any] = [dest_id]
        if tenant_id is not None:
            sql += " AND tenant_id = ?"
            params.append(tenant_id)
        rows = await self._fetchall(sql, params)
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
        sql = (
            f"SELECT {DESTINATION_COLUMNS} FROM herald_destinations"
            " WHERE tenant_id = ? AND deleted_at IS NULL"
        )
        params: list[Any] = [tenant_id]
        if status is not None:
            sql += " AND status = ?"
            params.append(status.value)
        if type is not None:
            sql += " AND type = ?"
            params.append(type)
        if before_id is not None:
            sql += " AND id < ?"
            params.append(before_id)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        return [destination_from_row(row, self._box) for row in await self._fetchall(sql, params)]

    async def delete_destination(self, tenant_id: str, dest_id: str, *, now: float) -> bool:
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_destinations SET deleted_at = ?, updated_at = ?"
                    " WHERE id = ? AND tenant_id = ? AND deleted_at IS NULL",
                    (now, now, dest_id, tenant_id),
                )
                if not cur.rowcount:
                    return False
                await db.execute(
                    "UPDATE herald_deliveries SET status = 'failure', next_attempt_at = NULL,"
                    " lease_owner = NULL, updated_at = ? WHERE destination_id = ?"
                    " AND status = 'pending'",
                    (now, dest_id),
                )
                await self._bump_version(db)
                return True
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    # --- deliveries and events ----------------------------------------------
    async def insert_deliveries(
        self, events: Sequence[Event], deliveries: Sequence[NewDelivery]
    ) -> None:
        try:
            async with self._tx() as db:
                now = time.time()
                await self._insert_events(db, events, now)
                await self._insert_deliveries(db, deliveries, now)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def get_delivery(
        self, tenant_id: str | None, delivery_id: str, *, with_attempts: bool
    ) -> Delivery | None:
        sql = (
            f"SELECT {DELIVERY_COLUMNS} FROM herald_deliveries d"
            " LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id WHERE d.id = ?"
        )
        params: list[Any] = [delivery_id]
        if tenant_id is not None:
            sql += " AND d.tenant_id = ?"
            params.append(tenant_id)
        rows = await self._fetchall(sql, params)
        if not rows:
            return None
        delivery = delivery_from_row(rows[0])
        if not with_attempts:
            return delivery
        attempts = await self._fetchall(
            f"SELECT {ATTEMPT_COLUMNS} FROM herald_attempts WHERE delivery_id = ?"
            " ORDER BY number, started_at",
            (delivery_id,),
        )
        from dataclasses import replace

        return replace(delivery, attempts=tuple(attempt_from_row(a) for a in attempts))

    @staticmethod
    def _filter_sql(flt: DeliveryFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if flt.tenant_id is not None:
            clauses.append("d.tenant_id = ?")
            params.append(flt.tenant_id)
        if flt.destination_id is not None:
            clauses.append("d.destination_id = ?")
            params.append(flt.destination_id)
        if flt.status is not None:
            clauses.append("d.status = ?")
            params.append(flt.status.value)
        if flt.event_types:
            clauses.append(f"d.event_type IN ({_placeholders(len(flt.event_types))})")
            params.extend(flt.event_types)
        if flt.since is not None:
            clauses.append("d.created_at >= ?")
            params.append(flt.since)
        if flt.until is not None:
            clauses.append("d.created_at < ?")
            params.append(flt.until)
        if flt.ids:
            clauses.append(f"d.id IN ({_placeholders(len(flt.ids))})")
            params.extend(flt.ids)
        if flt.kind is not None:
            clauses.append("d.kind = ?")
            params.append(flt.kind.value)
        return (" AND ".join(clauses) or "1 = 1"), params

    async def list_deliveries(
        self, flt: DeliveryFilter, *, before_id: str | None, limit: int
    ) -> list[Delivery]:
        where, params = self._filter_sql(flt)
        if before_id is not None:
            where += " AND d.id < ?"
            params.append(before_id)
        rows = await self._fetchall(
            f"SELECT {DELIVERY_COLUMNS} FROM herald_deliveries d"
            f" LEFT JOIN herald_attempts a ON a.id = d.last_attempt_id WHERE {where}"
            " ORDER BY d.id DESC LIMIT ?",
            [*params, limit],
        )
        return [delivery_from_row(row) for row in rows]

    async def count_deliveries(self, flt: DeliveryFilter) -> int:
        where, params = self._filter_sql(flt)
        rows = await self._fetchall(
            f"SELECT COUNT(*) FROM herald_deliveries d WHERE {where}", params
        )
        return int(rows[0][0])

    async def requeue(self, ids: Sequence[str], *, now: float, max_retries: int) -> int:
        if not ids:
            return 0
        marks = _placeholders(len(ids))
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_deliveries SET"
                    " max_attempts = CASE WHEN status = 'pending' THEN max_attempts"
                    "   ELSE attempt_count + ? END,"
                    " status = 'pending', next_attempt_at = ?, lease_owner = NULL,"
                    " updated_at = ?,"
                    " held = (SELECT CASE WHEN t.status = 'active' THEN 0 ELSE 1 END"
                    "   FROM herald_destinations t WHERE t.id = destination_id)"
                    f" WHERE id IN ({marks}) AND kind = 'event'"
                    " AND lease_owner IS NULL"
                    " AND destination_id IN (SELECT id FROM herald_destinations"
                    "   WHERE deleted_at IS NULL)",
                    (max_retries + 1, now, now, *ids),
                )
                return cur.rowcount
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def get_event(self, tenant_id: str | None, event_id: str) -> Event | None:
        sql = f"SELECT {EVENT_COLUMNS} FROM herald_events WHERE id = ?"
        params: list[Any] = [event_id]
        if tenant_id is not None:
            sql += " AND tenant_id = ?"
            params.append(tenant_id)
        rows = await self._fetchall(sql, params)
        return event_from_row(rows[0]) if rows else None

    async def get_outbox_event(self, tenant_id: str, event_id: str) -> Event | None:
        rows = await self._fetchall(
            "SELECT seq, CAST(id AS BLOB), CAST(tenant_id AS BLOB), CAST(type AS BLOB),"
            " CAST(data AS BLOB), CAST(created_at AS BLOB) FROM herald_outbox"
            " WHERE id = ? AND tenant_id = ?",
            (event_id, tenant_id),
        )
        if not rows:
            return None
        from herald.outbox import Reject, parse_row

        try:
            return parse_row(OutboxRow(*rows[0]), max_payload_bytes=1 << 62)
        except Reject:
            return None

    # --- idempotency ----------------------------------------------------------
    async def count_request(self, *, tenant_id: str, window_no: int, expire: bool) -> int:
        try:
            async with self._tx() as db:
                if expire:
                    await db.execute(
                        "DELETE FROM herald_rate_limits WHERE window_no < ?", (window_no,)
                    )
                rows = await self._fetchall(
                    "INSERT INTO herald_rate_limits (tenant_id, window_no, count)"
                    " VALUES (?, ?, 1) ON CONFLICT (tenant_id, window_no)"
                    " DO UPDATE SET count = count + 1 RETURNING count",
                    (tenant_id, window_no),
                    db=db,
                )
                return int(rows[0][0])
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def idempotency_begin(
        self, *, tenant_id: str, key: str, fingerprint: str, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        try:
            async with self._tx() as db:
                await db.execute(
                    "DELETE FROM herald_idempotency WHERE created_at < ?", (now - ttl,)
                )
                rows = await self._fetchall(
                    "SELECT fingerprint, status, body FROM herald_idempotency"
                    " WHERE tenant_id = ? AND key = ?",
                    (tenant_id, key),
                    db=db,
                )
                if rows:
                    fp, status, body = rows[0]
                    return IdempotencyRecord(fp, status, None if body is None else bytes(body))
                await db.execute(
                    "INSERT INTO herald_idempotency (tenant_id, key, fingerprint, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (tenant_id, key, fingerprint, now),
                )
                return None
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def idempotency_finish(
        self, *, tenant_id: str, key: str, status: int, body: bytes
    ) -> None:
        try:
            async with self._tx() as db:
                await db.execute(
                    "UPDATE herald_idempotency SET status = ?, body = ?"
                    " WHERE tenant_id = ? AND key = ?",
                    (status, body, tenant_id, key),
                )
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def idempotency_abort(self, *, tenant_id: str, key: str) -> None:
        try:
            async with self._tx() as db:
                await db.execute(
                    "DELETE FROM herald_idempotency WHERE tenant_id = ? AND key = ?"
                    " AND status IS NULL",
                    (tenant_id, key),
                )
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def purge(self, *, before: float, limit: int) -> int:
        try:
            async with self._tx() as db:
                ids = [
                    r[0]
                    for r in await self._fetchall(
                        "SELECT id FROM herald_deliveries WHERE status <> 'pending'"
                        " AND updated_at < ? ORDER BY updated_at LIMIT ?",
                        (before, limit),
                        db=db,
                    )
                ]
                if ids:
                    marks = _placeholders(len(ids))
                    await db.execute(
                        f"DELETE FROM herald_attempts WHERE delivery_id IN ({marks})", ids
                    )
                    await db.execute(f"DELETE FROM herald_deliveries WHERE id IN ({marks})", ids)
                await db.execute(
                    "DELETE FROM herald_events WHERE id IN (SELECT e.id FROM herald_events e"
                    " WHERE e.ingested_at < ? AND NOT EXISTS (SELECT 1 FROM herald_deliveries d"
                    " WHERE d.event_id = e.id) LIMIT ?)",
                    (before, limit),
                )
                await db.execute(
                    "DELETE FROM herald_outbox_rejected WHERE seq IN (SELECT seq FROM"
                    " herald_outbox_rejected WHERE rejected_at < ? LIMIT ?)",
                    (before, limit),
                )
                return len(ids)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    # --- API keys -----------------------------------------------------------
    async def create_api_key(self, *, key_hash: str, tenant_id: str, hint: str, now: float) -> None:
        try:
            async with self._tx() as db:
                await db.execute(
                    "INSERT INTO herald_api_keys (hash, tenant_id, hint, created_at)"
                    " VALUES (?, ?, ?, ?)",
                    (key_hash, tenant_id, hint, now),
                )
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    async def tenant_for_key(self, key_hash: str) -> str | None:
        rows = await self._fetchall(
            "SELECT tenant_id FROM herald_api_keys WHERE hash = ? AND revoked_at IS NULL",
            (key_hash,),
        )
        return str(rows[0][0]) if rows else None

    async def list_api_keys(self, tenant_id: str) -> list[ApiKeyInfo]:
        rows = await self._fetchall(
            "SELECT hash, tenant_id, hint, created_at, revoked_at FROM herald_api_keys"
            " WHERE tenant_id = ? ORDER BY created_at DESC, hash",
            (tenant_id,),
        )
        return [ApiKeyInfo(*row) for row in rows]

    async def revoke_api_keys(self, *, tenant_id: str, hash_prefix: str, now: float) -> int:
        try:
            async with self._tx() as db:
                cur = await db.execute(
                    "UPDATE herald_api_keys SET revoked_at = ?"
                    " WHERE tenant_id = ? AND substr(hash, 1, ?) = ? AND revoked_at IS NULL",
                    (now, tenant_id, len(hash_prefix), hash_prefix),
                )
                return int(cur.rowcount)
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc

    # --- key rotation ---------------------------------------------------------
    async def reencrypt_secrets(
        self, *, after_id: str | None, limit: int
    ) -> tuple[int, int, str | None]:
        try:
            async with self._tx() as db:
                rows = await self._fetchall(
                    "SELECT id, secrets FROM herald_destinations WHERE id > ? ORDER BY id LIMIT ?",
                    (after_id or "", limit),
                    db=db,
                )
                changed = reencrypt_rows(rows, self._box)
                if changed:
                    await db.executemany(
                        "UPDATE herald_destinations SET secrets = ? WHERE id = ?", changed
                    )
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite: {exc}") from exc
        return len(rows), len(changed), (str(rows[-1][0]) if rows else None)


def _filesystem_hint(path: Path) -> str:
    """Why SQLite's terse "unable to open database file" may have happened, if we can tell."""
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return ""
    if fs.f_flag & os.ST_RDONLY:
        return f" (the filesystem of {path.parent} is mounted read-only)"
    if fs.f_bavail == 0:
        return f" (the filesystem of {path.parent} is full)"
    return ""


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (no semicolons inside our literals)."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
