"""PostgreSQL through asyncpg: a pool, row leases, ``SKIP LOCKED``, ``NOTIFY``.

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
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, TypeVar, Unpack

import asyncpg
import structlog

from herald.errors import StorageError
from herald.model import OutboxRow
from herald.retry import retry_storage
from herald.store.base import check_migrations, load_migrations
from herald.store.dialect import Claim, NamedQueries, Row
from herald.store.queries import load_queries
from herald.store.sqlstore import SQLStore, StoreOptions

T = TypeVar("T")

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


# How long `herald check-config --check-db` waits for PostgreSQL to answer.
CHECK_TIMEOUT_SECONDS = 5.0


def migrations() -> list[tuple[int, str, str]]:
    """The numbered migration scripts shipped with the package, in order."""
    return load_migrations("postgres")


@contextmanager
def _storage_errors() -> Iterator[None]:
    """The one place where driver errors become StorageError."""
    try:
        yield
    except _DB_ERRORS as exc:
        raise StorageError(f"PostgreSQL: {type(exc).__name__}: {exc}") from exc


def _count(status: str) -> int:
    """The row count of a command status such as ``UPDATE 3`` or ``INSERT 0 1``."""
    tail = status.rpartition(" ")[2]
    return int(tail) if tail.isdigit() else 0


class PostgresDialect(NamedQueries):
    """The database several instances share."""

    name = "postgres"
    shared = True
    # SKIP LOCKED claims never block a producer: no need to look before claiming.
    idle_read = False

    def __init__(self, dsn: str, *, pool_size: int = 10) -> None:
        self.dsn = dsn
        self._pool_size = pool_size
        super().__init__()
        # Both forms of the claim, made once: with and without a due_since bound.
        claim = self._q["claim"]
        self._claims = {
            False: claim.replace("{since}", ""),
            True: claim.replace("{since}", " AND next_attempt_at >= $7"),
        }
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection | None = None
        self._on_notify: Callable[[], None] | None = None
        self._relisten: asyncio.Task[None] | None = None
        self._closing = False

    # --- lifecycle --------------------------------------------------------
    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self._pool_size,
                command_timeout=60,
                server_settings=SESSION_SETTINGS,
            )
            async with self._pool.acquire() as conn, conn.transaction():
                await self._migrate(conn)
        except _DB_ERRORS as exc:
            await self.close()
            raise StorageError(f"cannot open PostgreSQL database: {exc}") from exc
        except BaseException:
            # E.g. a schema newer than this Herald: the pool must not outlive the failure.
            await self.close()
            raise

    async def _migrate(self, conn: asyncpg.Connection) -> None:
        await self.execute(conn, "migration_lock")
        await self.execute(conn, "migrations_table")
        done = {r[0] for r in await self.fetch(conn, "migrations_done")}
        known = migrations()
        check_migrations(known, done)
        for version, name, script in known:
            if version not in done:
                await conn.execute(script)  # a script of several statements, as it is
                await self.execute(conn, "migration_applied", version, name, time.time())

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

    async def ping(self) -> None:
        await self.read("ping")

    # --- statements -------------------------------------------------------
    @asynccontextmanager
    async def tx(self, *, atomic: bool = True) -> AsyncIterator[asyncpg.Connection]:
        # Not atomic: a single statement commits on its own, without BEGIN and COMMIT.
        with _storage_errors():
            async with self.pool.acquire() as conn:
                if not atomic:
                    yield conn
                    return
                async with conn.transaction():
                    yield conn

    async def transact(self, body: Callable[[asyncpg.Connection], Coroutine[Any, Any, T]]) -> T:
        async with self.tx() as conn:
            return await body(conn)

    async def read(
        self, name: str, *args: Any, gauges: bool = False, parts: Mapping[str, str] | None = None
    ) -> list[Row]:
        sql = self._q[name] if parts is None else self._q[name].format_map(parts)
        with _storage_errors():
            return list(await self.pool.fetch(sql, *args))

    async def execute(self, conn: asyncpg.Connection, name: str, *args: Any) -> int:
        return _count(await conn.execute(self._q[name], *args))

    async def fetch(self, conn: asyncpg.Connection, name: str, *args: Any) -> list[Row]:
        return list(await conn.fetch(self._q[name], *args))

    async def fetchrow(self, conn: asyncpg.Connection, name: str, *args: Any) -> Row | None:
        row: Row | None = await conn.fetchrow(self._q[name], *args)
        return row

    async def fetchval(self, conn: asyncpg.Connection, name: str, *args: Any) -> Any:
        return await conn.fetchval(self._q[name], *args)

    async def insert_many(
        self, conn: asyncpg.Connection, name: str, rows: Sequence[tuple[Any, ...]]
    ) -> None:
        # One statement of unnest()ed arrays, a column each: a row-by-row executemany
        # costs a round of parse, bind and execute messages per row.
        if rows:
            await conn.execute(self._q[name], *(list(col) for col in zip(*rows, strict=True)))

    def param(self, n: int) -> str:
        return f"${n}"

    def any_of(self, column: str, values: Sequence[Any], params: list[Any]) -> str:
        params.append(list(values))
        return f"{column} = ANY(${len(params)})"

    def is_unique_violation(self, exc: BaseException | None) -> bool:
        return isinstance(exc, asyncpg.UniqueViolationError)

    def outbox_delete_args(self, rows: Sequence[OutboxRow]) -> tuple[Any, ...]:
        # Another relay may hold locked rows between these: the claimed seqs, one by one.
        return ([r.seq for r in rows],)

    def oldest_epoch(self, value: Any) -> float | None:
        return None if value is None else float(value)

    # --- LISTEN/NOTIFY ----------------------------------------------------
    async def watch_outbox(
        self, callback: Callable[[], None], *, every: float, listening: asyncio.Event | None = None
    ) -> bool:
        """LISTEN for outbox inserts on a dedicated connection; call ``callback`` on each
        (``listening`` does not matter: a notification costs nothing to ignore).

        The connection is re-established whenever it is lost (a database restart, a
        terminated backend), with ``callback`` called once it is back, since
        notifications sent meanwhile are gone; until then the relay polls.
        """
        self._on_notify = callback
        with _storage_errors():
            await self._listen()
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
            with _storage_errors():
                await self._listen()
            return True

        def trouble(exc: StorageError, delay: float) -> None:
            log.warning("outbox_listener_reconnect_failed", error=exc.message, retry_in=delay)

        await asyncio.sleep(0.2)
        if await retry_storage(listen, on_error=trouble, until=lambda: self._closing, first=0.4):
            log.info("outbox_listener_restored", channel=NOTIFY_CHANNEL)
            assert self._on_notify is not None
            self._on_notify()  # whatever was inserted while nobody listened

    # --- operations whose algorithm differs -------------------------------
    async def claim(self, conn: asyncpg.Connection, want: Claim) -> list[Row]:
        # One statement: rows another instance is claiming are skipped, not waited for.
        since = () if want.due_since is None else (want.due_since,)
        return list(
            await conn.fetch(
                self._claims[want.due_since is not None],
                want.owner,
                want.lease_until,
                want.now,
                list(want.exclude),
                want.limit,
                list(want.exclude_tenants),
                *since,
            )
        )

    async def claim_flow(
        self, conn: asyncpg.Connection, want: Claim, takes: Sequence[tuple[str, int]]
    ) -> list[Row]:
        # One statement, a lateral probe of herald_deliveries_flow per destination.
        return await self.fetch(
            conn,
            "claim_flow",
            want.owner,
            want.lease_until,
            [d for d, _ in takes],
            want.now,
            [n for _, n in takes],
            list(want.exclude_tenants),
        )

    async def lock_for_attempts(
        self, conn: asyncpg.Connection, every: Sequence[str], must: Sequence[str]
    ) -> list[Row]:
        # Lock order is destination, then its deliveries, as in delete and update:
        # activating or counting after updating the deliveries would deadlock with them.
        if not every:
            return []
        return await self.fetch(conn, "lock_for_record", list(every), list(must))

    async def heartbeat(self, conn: asyncpg.Connection, row: tuple[Any, ...]) -> bool:
        return bool(await self.fetchval(conn, "heartbeat", *row))

    async def reap(
        self, conn: asyncpg.Connection, *, stale_before: float, now: float
    ) -> dict[str, int]:
        dead = [r[0] for r in await self.fetch(conn, "reap_delete", stale_before)]
        if not dead:
            return {}
        reaped = dict.fromkeys(dead, 0)
        for (owner,) in await self.fetch(conn, "reap_release", now, dead):
            reaped[owner] += 1
        return reaped

    async def purge_deliveries(
        self, conn: asyncpg.Connection, ids: list[str], *, before: float, limit: int
    ) -> None:
        if ids:
            # Their events' keys: (id, tenant), each once.
            gone = list({(r[0], r[1]) for r in await self.fetch(conn, "purge_deliveries", ids)})
            await self.execute(
                conn, "purge_events_of", [g[0] for g in gone], before, [g[1] for g in gone]
            )
        if len(ids) < limit:
            await self.execute(conn, "jit_off")
            await self.execute(conn, "purge_unused_events", before, limit)


class PostgresStore(SQLStore[PostgresDialect]):
    """The backend for several instances sharing one database."""

    def __init__(self, dsn: str, *, pool_size: int = 10, **options: Unpack[StoreOptions]) -> None:
        super().__init__(PostgresDialect(dsn, pool_size=pool_size), **options)
        self.dsn = dsn

    @property
    def pool(self) -> asyncpg.Pool:
        return self.dialect.pool


async def applied_migrations(dsn: str) -> set[int]:
    """The migration versions the database at ``dsn`` has, read-only; a bounded connect."""
    with _storage_errors():
        conn = await asyncpg.connect(dsn, timeout=CHECK_TIMEOUT_SECONDS)
        try:
            if await conn.fetchval("SELECT to_regclass('herald_schema_migrations')") is None:
                return set()
            rows = await conn.fetch(load_queries("postgres")["migrations_done"])
            return {row[0] for row in rows}
        finally:
            await conn.close()
