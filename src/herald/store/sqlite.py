"""SQLite: WAL mode, one writer connection on a thread of its own, two readers.

SQLite allows one writer at a time, so every write goes through a single
connection (``store.sqlitethread``: the engine's busy transactions run there whole)
and each write operation is one short ``BEGIN IMMEDIATE`` transaction; reads go
through aiosqlite on two connections of their own, which WAL lets run beside it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar, Unpack

import aiosqlite
import structlog
import tenacity

from herald.errors import StorageError
from herald.model import OutboxRow
from herald.store.base import check_migrations, load_migrations
from herald.store.dialect import Claim, NamedQueries, Row
from herald.store.fswatch import FileWatch
from herald.store.queries import load_queries
from herald.store.sqlitethread import InThread, ThreadConnection
from herald.store.sqlstore import SQLStore, StoreOptions
from herald.timeutil import parse_timestamp

# The commit check of an idle daemon (SQLiteDialect.watch_outbox): after a second
# without commits it looks every 50 ms instead of every relay.poll_interval_seconds.
# Without inotify (not Linux) the commit check polls. Each look is an event-loop
# wake-up, about 0.3 ms of CPU on the 2-core test guest: 20 a second once quiet
# keep a first row after a quiet spell within 50 ms (bench idle: 1.13 % of a core;
# with inotify an idle daemon does not look at all; docs/performance.md).
QUIET_AFTER_SECONDS = 1.0
QUIET_LOOK_SECONDS = 0.05
# After a write to the database's files, the first look for its commit; the next
# ones twice as far apart each, up to QUIET_LOOK_SECONDS (or the poll interval, if
# longer), for QUIET_AFTER_SECONDS.
RELOOK_FIRST_SECONDS = 0.002

log = structlog.get_logger("herald.store")
T = TypeVar("T")
C = TypeVar("C", aiosqlite.Connection, ThreadConnection)

# What writes: the writer connection, or a transaction body in its thread.
Writing = ThreadConnection | InThread


def migrations() -> list[tuple[int, str, str]]:
    """The numbered migration scripts shipped with the package, in order."""
    return load_migrations("sqlite")


@functools.lru_cache(maxsize=1024)
def _expand(sql: str, first: int, n: int) -> str:
    """``sql`` with ``{ids}`` as ``n`` numbered placeholders from ``first`` on: SQLite
    has no array parameter. Cached: batches keep coming in the same few sizes."""
    return sql.replace("{ids}", ",".join([f"?{i}" for i in range(first, first + n)]))


class SQLiteDialect(NamedQueries):
    """The embedded default database."""

    name = "sqlite"
    shared = False
    # WAL readers take no lock: an idle relay's read never blocks a producer's write.
    idle_read = True

    def __init__(self, path: Path, *, busy_timeout: float = 5.0) -> None:
        self.path = path
        self._busy_ms = int(busy_timeout * 1000)
        super().__init__()
        self._lists = frozenset(name for name, sql in self._q.items() if "{ids}" in sql)
        # The writer runs whole transactions in its thread (store.sqlitethread).
        self._w: ThreadConnection | None = None
        self._r: aiosqlite.Connection | None = None
        # The gauges' counts (``herald_deliveries_pending`` and the like) take 0.1 s at
        # a million scheduled retries: on their own connection, so the claims and the
        # relay's catalog checks on the reader never queue behind them.
        self._g: aiosqlite.Connection | None = None
        # One connection writes; the relay, the workers and the API take turns.
        self._write_lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None

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
            _create_private(self.path)
            self._w = await ThreadConnection.connect(self.path, pragmas=self._pragmas())
            await self._w.execute("PRAGMA journal_mode=WAL")
            await self._migrate(self._w)
            self._r = await self._connect()
            self._g = await self._connect()
        except BaseException:
            await self.close()
            raise

    def _pragmas(self) -> tuple[str, ...]:
        # NORMAL in WAL mode survives a process crash; only an OS crash can drop
        # the last commits, which at-least-once redelivery then covers.
        return (f"PRAGMA busy_timeout={self._busy_ms}", "PRAGMA synchronous=NORMAL")

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            for pragma in self._pragmas():
                await conn.execute(pragma)
        except BaseException:
            # SQLite opens the file lazily, so a read-only or missing directory fails
            # here; the connection's worker thread must not keep the process alive.
            with suppress(sqlite3.Error, ValueError):
                await conn.close()
            raise
        return conn

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        for conn in (self._g, self._r, self._w):
            if conn is not None:
                with suppress(sqlite3.Error, ValueError):
                    await conn.close()
        self._g = self._r = self._w = None

    async def _migrate(self, db: ThreadConnection) -> None:
        # Everything, the bookkeeping table included, under the write lock: two
        # processes opening a new file at once must queue, not fail with "locked".
        await db.execute("BEGIN IMMEDIATE")
        try:
            await self.execute(db, "migrations_table")
            done = {row[0] for row in await self.fetch(db, "migrations_done")}
            known = migrations()
            check_migrations(known, done)
            for version, name, script in known:
                if version in done:
                    continue
                for statement in _split_sql(script):
                    await db.execute(statement)
                await self.execute(db, "migration_applied", version, name, time.time())
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    def _conn(self, conn: C | None) -> C:
        if conn is None:
            raise StorageError("the store is not open")
        return conn

    @property
    def _writer(self) -> ThreadConnection:
        return self._conn(self._w)

    @property
    def _reader(self) -> aiosqlite.Connection:
        return self._conn(self._r)

    @property
    def _gauges(self) -> aiosqlite.Connection:
        return self._conn(self._g)

    async def ping(self) -> None:
        """A real read, and proof that the write lock can be taken."""
        await self.read("ping")
        async with self.tx():
            pass

    # --- statements -------------------------------------------------------
    @asynccontextmanager
    async def tx(self, *, atomic: bool = True) -> AsyncIterator[ThreadConnection]:
        # ``atomic`` aside: every write, even of one statement, takes the write lock.
        with _storage_errors():
            async with self._write_lock:
                db = self._writer
                await db.begin()
                try:
                    yield db
                except BaseException:
                    with suppress(sqlite3.Error):
                        await db.execute("ROLLBACK")
                    raise
                try:
                    await db.execute("COMMIT")
                except sqlite3.Error:
                    # SQLite may already have rolled back (SQLITE_FULL does): keep its
                    # error, not "cannot rollback - no transaction is active".
                    with suppress(sqlite3.Error):
                        await db.execute("ROLLBACK")
                    raise

    async def transact(self, body: Callable[[InThread], Coroutine[Any, Any, T]]) -> T:
        """``body`` in one write transaction, run in the writer's thread in one call:
        no round trip to the event loop between its statements (store.sqlitethread)."""
        with _storage_errors():
            async with self._write_lock:
                return await self._writer.transaction(body)

    def _sql(self, name: str, args: Sequence[Any]) -> tuple[str, Sequence[Any]]:
        sql = self._q[name]
        if name not in self._lists:
            return sql, args
        values = args[-1]
        return _expand(sql, len(args), len(values)), (*args[:-1], *values)

    async def read(
        self, name: str, *args: Any, gauges: bool = False, parts: Mapping[str, str] | None = None
    ) -> list[Row]:
        sql, params = self._sql(name, args)
        if parts is not None:
            sql = sql.format_map(parts)
        with _storage_errors():
            return await self._rows(self._gauges if gauges else self._reader, sql, params)

    @staticmethod
    async def _rows(
        db: aiosqlite.Connection | Writing, sql: str, params: Sequence[Any]
    ) -> list[Row]:
        # Stepped, fetched and finalised in one call on the connection's thread: a
        # cancel between an execute and its fetch would leave the statement open,
        # and with it the read snapshot the connection's next reads would see.
        return list(await db.execute_fetchall(sql, params))

    async def execute(self, conn: Writing, name: str, *args: Any) -> int:
        return await conn.execute(*self._sql(name, args))

    async def fetch(self, conn: Writing, name: str, *args: Any) -> list[Row]:
        return await self._rows(conn, *self._sql(name, args))

    async def fetchrow(self, conn: Writing, name: str, *args: Any) -> Row | None:
        rows = await self.fetch(conn, name, *args)
        return rows[0] if rows else None

    async def fetchval(self, conn: Writing, name: str, *args: Any) -> Any:
        rows = await self.fetch(conn, name, *args)
        return rows[0][0] if rows else None

    async def insert_many(self, conn: Writing, name: str, rows: Sequence[tuple[Any, ...]]) -> None:
        # One prepared statement stepped per row, in-process: as fast as SQLite inserts.
        await self.executemany(conn, name, rows)

    def param(self, n: int) -> str:
        return f"?{n}"

    def any_of(self, column: str, values: Sequence[Any], params: list[Any]) -> str:
        first = len(params) + 1
        params.extend(values)
        return f"{column} IN ({','.join([f'?{i}' for i in range(first, len(params) + 1)])})"

    def is_unique_violation(self, exc: BaseException | None) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)

    def outbox_delete_args(self, rows: Sequence[OutboxRow]) -> tuple[Any, ...]:
        # The single writer claimed every row from the first to the last: a range.
        return rows[0].seq, rows[-1].seq

    def oldest_epoch(self, value: Any) -> float | None:
        if value is None:
            return None
        try:
            # A poison row can hold any bytes until the relay moves it out.
            return parse_timestamp(bytes(value).decode("utf-8", "replace")).epoch
        except ValueError:
            return None

    async def watch_outbox(
        self, callback: Callable[[], None], *, every: float, listening: asyncio.Event | None = None
    ) -> bool:
        """Call ``callback`` when any other connection, in any process, committed to
        the database: looked at when a file of it is written, at most every ``every``
        seconds, and only while ``listening`` is set.

        SQLite has no notifications across processes. ``PRAGMA data_version`` changes
        exactly when another connection commits; asked on a connection of its own in
        the event loop's thread it costs microseconds, where a relay pass through
        aiosqlite's thread costs about a millisecond. On Linux an inotify watch on
        the database's directory (``fswatch``) says when to ask, so an idle daemon
        does not wake at all; elsewhere it asks every ``every`` seconds, and every
        ``QUIET_LOOK_SECONDS`` once nothing was committed for a second.

        While the relay runs one full pass after another, ``listening`` is clear and
        the watch sleeps: its look, every ``every`` seconds under load (Herald's own
        writer commits all the time), would wake nobody.
        """
        # One watcher per store: the engine refuses a second (EngineStore.watch_outbox).
        self._watch = asyncio.create_task(
            self._watch_commits(callback, every, listening), name="herald-sqlite-commits"
        )
        return True

    async def _watch_commits(
        self, callback: Callable[[], None], every: float, listening: asyncio.Event | None
    ) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # A commit writes the -wal file (or, in rollback-journal mode, the database).
        name = self.path.name
        watch = FileWatch.open(self.path.parent, (name, f"{name}-wal", f"{name}-journal"))
        log.info(
            "sqlite_commit_watch",
            mode="inotify" if watch is not None else "poll",
            directory=str(self.path.parent.resolve()),
        )
        try:
            # Never wait on a lock in the event loop: busy means someone is writing.
            conn.execute("PRAGMA busy_timeout=0")
            last: object = None
            quiet_since = written_at = time.monotonic()
            relook = RELOOK_FIRST_SECONDS
            while True:
                if listening is not None and not listening.is_set():
                    await listening.wait()
                try:
                    # Stepped to the end and closed: a statement left open would keep
                    # a read snapshot, and the WAL could never be checkpointed away.
                    cursor = conn.execute("PRAGMA data_version")
                    [(version,)] = cursor.fetchall()
                    cursor.close()
                except sqlite3.Error:
                    version = None  # busy or failing: let the relay look (and report)
                now = time.monotonic()
                changed = version != last or version is None
                if changed:
                    last = version
                    quiet_since = now
                    callback()
                if watch is not None:
                    relooking: float | None = None
                    if changed:
                        # At most one look per ``every`` however busy the writers:
                        # their writes meanwhile end the next wait at once.
                        await asyncio.sleep(every)
                    elif now - written_at < QUIET_AFTER_SECONDS:
                        # A writer writes the -wal (and syncs it) before it publishes
                        # the commit in the shared-memory index, which inotify does
                        # not see: look again soon, then less often, for a second
                        # (the relay's own writes and the heartbeats' come here too),
                        # and at once on the next write.
                        relooking = relook
                        relook = min(relook * 2, max(every, QUIET_LOOK_SECONDS))
                    try:
                        async with asyncio.timeout(relooking):
                            written = await watch.written()
                    except TimeoutError:
                        continue
                    if written:
                        written_at = time.monotonic()
                        relook = RELOOK_FIRST_SECONDS
                        continue
                    watch.close()
                    watch = None
                    log.warning("sqlite_commit_watch", mode="poll", why="the directory went away")
                quiet = now - quiet_since >= QUIET_AFTER_SECONDS
                await asyncio.sleep(max(every, QUIET_LOOK_SECONDS) if quiet else every)
        finally:
            if watch is not None:
                watch.close()
            conn.close()

    # --- operations whose algorithm differs -------------------------------
    async def claim(self, conn: Writing, want: Claim) -> list[Row]:
        where = ""
        params: list[Any] = [want.now]
        if want.due_since is not None:
            where += " AND next_attempt_at >= ?"
            params.append(want.due_since)
        if want.exclude:
            where += f" AND destination_id NOT IN ({','.join('?' * len(want.exclude))})"
            params.extend(want.exclude)
        if want.exclude_tenants:
            where += f" AND tenant_id NOT IN ({','.join('?' * len(want.exclude_tenants))})"
            params.extend(want.exclude_tenants)
        # Selected, then leased: RETURNING would give the new next_attempt_at, and the
        # caller wants when each was due. The write lock keeps the two together.
        sql = self._q["claim_select"].replace("{where}", where)
        return await self._lease(conn, want, await self._rows(conn, sql, (*params, want.limit)))

    async def claim_flow(
        self, conn: Writing, want: Claim, takes: Sequence[tuple[str, int]]
    ) -> list[Row]:
        # One index probe per destination (herald_deliveries_flow), then one lease.
        where = ""
        if want.exclude_tenants:
            where = f" AND tenant_id NOT IN ({','.join('?' * len(want.exclude_tenants))})"
        sql = self._q["claim_flow_select"].replace("{where}", where)
        claimed: list[Row] = []
        for dest_id, n in takes:
            claimed += await self._rows(conn, sql, (want.now, dest_id, n, *want.exclude_tenants))
        return await self._lease(conn, want, claimed)

    async def _lease(self, conn: Writing, want: Claim, claimed: list[Row]) -> list[Row]:
        """Lease the rows a claim selected to ``want.owner``; returns them."""
        if claimed:
            ids = [r[0] for r in claimed]
            await self.execute(conn, "claim_lease", want.owner, want.lease_until, ids)
        return claimed

    async def lock_for_attempts(
        self, conn: Writing, every: Sequence[str], must: Sequence[str]
    ) -> list[Row]:
        # The write lock is the only lock: every live destination's state, as it is.
        if not every:
            return []
        return await self.fetch(conn, "signal_state", list(every))

    async def heartbeat(self, conn: Writing, row: tuple[Any, ...]) -> bool:
        if await self.execute(conn, "heartbeat_update", row[5], row[0]):
            return True
        await self.execute(conn, "heartbeat_insert", *row)
        return False

    async def reap(self, conn: Writing, *, stale_before: float, now: float) -> dict[str, int]:
        reaped: dict[str, int] = {}
        for (instance_id,) in await self.fetch(conn, "reap_select", stale_before):
            reaped[instance_id] = await self.execute(conn, "release_leases", now, instance_id)
            await self.execute(conn, "remove_instance", instance_id)
        return reaped

    async def purge_deliveries(
        self, conn: Writing, ids: list[str], *, before: float, limit: int
    ) -> None:
        if ids:
            await self.execute(conn, "purge_deliveries", ids)
        await self.execute(conn, "purge_events", before, limit)


class SQLiteStore(SQLStore[SQLiteDialect]):
    """The embedded default backend."""

    def __init__(
        self, path: Path, *, busy_timeout: float = 5.0, **options: Unpack[StoreOptions]
    ) -> None:
        super().__init__(SQLiteDialect(path, busy_timeout=busy_timeout), **options)
        self.path = path


@contextmanager
def _storage_errors() -> Iterator[None]:
    """The one place where driver errors become StorageError."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StorageError(f"SQLite: {exc}") from exc


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


def _create_private(path: Path) -> None:
    """Create a new database file readable by its owner only (0600), like the key file:
    it holds every payload and the destinations' sealed credentials. SQLite would create
    it with the umask's mode; it gives its -wal and -shm files the main file's mode. An
    existing file keeps the mode it has (the operator's to choose)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)  # an empty file is a new database to SQLite


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (no semicolons inside our literals):
    sqlite3 runs one statement per call, and executescript would commit our transaction."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


async def applied_migrations(path: Path) -> set[int] | None:
    """The migration versions the file at ``path`` has (None: no file yet), read-only."""

    def read() -> set[int] | None:
        if not path.exists():
            return None
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'herald_schema_migrations'"
            ).fetchone()
            if not exists:
                return set()
            return {row[0] for row in conn.execute(load_queries("sqlite")["migrations_done"])}
        finally:
            conn.close()

    try:
        return await asyncio.to_thread(read)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot read SQLite database {path}: {exc}") from exc
