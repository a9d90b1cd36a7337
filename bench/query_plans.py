"""The plans of Herald's hot queries at 10,000,000 deliveries, as its stores send them.

For each backend (PostgreSQL, then SQLite) a fresh database is created with
Herald's migrations and filled with SQL run in the database (``generate_series``
on PostgreSQL, a recursive CTE on SQLite), 1,000,000 rows a statement, with the
secondary indexes dropped during the load and then rebuilt from their own
definitions:

- N deliveries (10,000,000) created over 32 days, time-ordered ids, to 500
  destinations of 20 tenants, skewed as real traffic is (the busiest
  destination has 4.5 % of all deliveries, the quietest 0.1 %);
- 95 % finished (2 % of all ``failure``, the rest ``success``); the other 5 %,
  all among the newest quarter, are a retry backlog: of those, 20 % are due
  now, 70 % scheduled retries up to 6 hours ahead, 10 % leased by a running
  instance; the pending deliveries of every 25th destination (paused) are held;
- one ``herald_attempts`` row (the last attempt) for every attempted delivery,
  and a ``herald_events`` row for every pending one (what ``claim_due`` reads).

PostgreSQL then gets ``VACUUM ANALYZE`` (the bench server runs with autovacuum
off; a production server would have done both); SQLite gets nothing, as Herald
runs no ``ANALYZE`` on it.

Then Herald's own code (``herald.wiring.components``) makes the calls whose SQL
matters at this size, with the statements recorded at the driver (asyncpg's
query logger; a recording wrapper around the SQLite store's connections):

- ``claim_due`` — the dispatcher's claim of ``delivery.claim_batch_size`` due
  deliveries, and the same with ``exclude_destinations`` (the three busiest
  destinations saturated), as ``Dispatcher`` calls it;
- ``next_due_at`` — when the dispatcher wakes next;
- ``list_deliveries`` — page 2 of ``GET /v2/event-destinations/{id}/event-deliveries
  ?status=failure`` for the busiest destination (tenant, destination and status
  filters, the cursor from page 1), through ``Operations.list_deliveries``;
- ``count_deliveries`` — the count of a replay dry run with the same filter
  (``Operations.replay(dry_run=True)``);
- ``purge_select`` — the retention purge's selection of a batch
  (``store.purge`` with ``retention.days`` and ``retention.batch_size``).

Each recorded statement, with its recorded parameters, is then explained
(PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)`` after one warm-up run, writes in a
rolled-back transaction, the store's ``plan_cache_mode``; SQLite: ``EXPLAIN
QUERY PLAN``) and executed ``--repeat`` times (writes rolled back) for its
latency. ``tests/integration/test_query_plans.py`` runs the same scenario at
200,000 rows and checks which indexes the plans read.

The full run writes ``bench/results/query_plans.json`` and ``docs/query-plans.md``.
If the first SQLite chunk shows that loading N rows would exceed
``--sqlite-budget`` (600 s), 1,000,000 are loaded instead and the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import (
    REPO_ROOT,
    BenchError,
    Deadline,
    grid,
    iso_now,
    load_avg,
    log,
    machine,
    percentile,
    write_named,
)

if TYPE_CHECKING:
    import asyncpg

    from herald.config import Settings
    from herald.store import Store
    from herald.wiring import Components

NAME = "query_plans"
HELP = "EXPLAIN the claim, listing, count and purge queries at 10,000,000 deliveries"
ROWS, QUICK_ROWS, SQLITE_FALLBACK = 10_000_000, 200_000, 1_000_000
CHUNK = 1_000_000
REPEAT = 20
SQLITE_BUDGET = 600.0
TIMEOUT = 1800.0
DOC = REPO_ROOT / "docs" / "query-plans.md"
BACKENDS = ("postgres", "sqlite")

DAY = 86_400.0
SPAN_DAYS = 32.0
TENANTS, DESTINATIONS = 20, 500
PAUSED_EVERY = 25
"""The pending deliveries of every 25th destination are held (the destination is paused)."""
PENDING_PERMILLE, FAILURE_PERMILLE = 200, 20
"""Pending: 200 ‰ of the newest quarter (5 % of all); failure: 20 ‰ of the rest."""
MAX_ATTEMPTS = 11
SATURATED = 3
FAILING = DESTINATIONS // 2
"""The destination whose last error the overview reads: one of middling traffic (for the
busiest, 4.5 % of every delivery, PostgreSQL rightly walks the primary key backwards
instead, meeting one of its deliveries every 22 rows)."""
"""``claim_due`` excluding the three busiest destinations, as a saturated dispatcher does."""
LEASE_OWNER = "herald-2:4242:01jqk5z8rn"
EVENT_DATA = (
    '{"task_run_id":"tr_0001234567","workflow":"nightly-invoice-sync","status":"completed",'
    '"attempt":1,"duration_ms":61234,"finished_at":"2025-06-01T02:30:00.000Z",'
    '"records":{"read":1800,"written":1790,"skipped":3}}'
)
QUERIES = (
    "claim_due",
    "claim_due_excluding",
    "next_due_at",
    "list_deliveries",
    "count_deliveries",
    "purge_select",
    "last_failed_attempt",
    "list_events",
)
CALLS = {
    "claim_due": "store.claim_due(now, limit=claim_batch_size, owner, lease_until)",
    "claim_due_excluding": "the same with exclude_destinations = the 3 busiest",
    "next_due_at": "store.next_due_at()",
    "list_deliveries": "service.list_deliveries(tenant, destination, status=failure;"
    " cursor of page 2, limit 20)",
    "count_deliveries": "service.replays.run(same filter, dry_run=True): its count",
    "purge_select": "store.purge(before=now - retention.days, limit=retention.batch_size):"
    " its selection",
    "last_failed_attempt": "store.last_failed_attempt(a destination of middling traffic): the"
    " overview's last error of a failing destination",
    "list_events": "service.recent_events(tenant, type=invoice.paid; after page 1, limit 50):"
    " page 2 of the portal's events list",
}
NOTES = {
    "claim_due": (
        "A partial index holds only pending deliveries, in `next_attempt_at` order after"
        " `held` and the lane: `herald_deliveries_pending (held, flow, next_attempt_at) WHERE"
        " status = 'pending'` (on SQLite with `destination_id` as a fourth column, see below)."
        " The claim reads the common lane (`flow = 0`; the deliveries of destinations under flow"
        " control are in the flow lane, read per destination through `herald_deliveries_flow`"
        " by the statement before this one, `flow_due`: none here), its first"
        " `claim_batch_size` due entries, and updates those rows, found by primary key."
        " Finished deliveries are not in the index: the cost follows the batch, not the table."
        " On SQLite the claim is two statements since session 7 (it needs each row's due time"
        " from before the lease): this selection, then an `UPDATE … WHERE id IN (…)` of the"
        " rows it found; the plan and the times here are the selection's alone."
    ),
    "claim_due_excluding": (
        "The same range scan; the saturated destinations are a filter on it, so the claim"
        " reads past their due deliveries (“Rows Removed by Filter”) before it has a batch."
        " SQLite judges them from the index entry (`destination_id` is in it); PostgreSQL"
        " fetches each row first."
    ),
    "next_due_at": (
        "`MIN(next_attempt_at)` over non-held pending deliveries, per lane, is the first entry"
        " of the same partial index after `held = 0` and `flow = 0` (then `flow = 1`): one"
        " index probe each."
    ),
    "list_deliveries": (
        "Equalities on tenant, destination and status, `id < cursor`, `ORDER BY id DESC"
        " LIMIT 21`. Three indexes can serve it, walked backwards from the cursor:"
        " `herald_deliveries_destination (destination_id, id)`, `herald_deliveries_tenant"
        " (tenant_id, id)` or the primary key; the filters the index does not cover are"
        " checked on each row visited. A walk that stops at 21 matches visits about 21 ÷"
        " (share of the walked rows that match) rows: it depends on how dense the matches are,"
        " not on how much history lies below the cursor (a parallel walk overshoots: each"
        " worker reads ahead). A bitmap scan instead visits every row of the destination older"
        " than the cursor and sorts them. Each row's"
        " last attempt is one primary-key probe of `herald_attempts`."
    ),
    "count_deliveries": (
        "A count has no `LIMIT`: it visits every delivery of the destination (or of the tenant,"
        " depending on the index read) and checks the other filters on each, so it grows with"
        " that destination's history, not with the table's. Only a replay counts (its dry run"
        " and its response); the listing never does."
    ),
    "purge_select": (
        "The partial index `herald_deliveries_outcomes (updated_at, status, destination_id)"
        " WHERE status <> 'pending'` returns the oldest finished deliveries first; the batch"
        " stops after `retention.batch_size` entries, however many are younger."
    ),
    "last_failed_attempt": (
        "The destination's deliveries newest first on `herald_deliveries_destination"
        " (destination_id, id)`, each one's last attempt a primary-key probe of"
        " `herald_attempts`, to the first that failed: for a failing destination, its newest."
    ),
    "list_events": (
        "`herald_events_ingested (ingested_at)` walked backwards from the cursor's time; the"
        " tenant and the type are checked on each event visited (there is no index on"
        " `(tenant_id, ingested_at)`: a rare tenant's page visits more events), and events"
        " stored in the same relay batch are ordered by id, then tenant."
    ),
}
_SIZE_TABLES = ("herald_deliveries", "herald_attempts", "herald_events")


# --- the data set -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Shape:
    """The generated data set: ``rows`` deliveries ending at ``now``."""

    rows: int
    now: float

    @property
    def start(self) -> float:
        return self.now - SPAN_DAYS * DAY

    @property
    def pending_after(self) -> int:
        """Pending deliveries are among the rows after this one (the newest quarter)."""
        return self.rows - self.rows // 4

    @staticmethod
    def delivery_id(g: int) -> str:
        return f"dlv_{g:026x}"

    @staticmethod
    def destination(k: int) -> str:
        """Destination ``k``; 0 is the busiest."""
        return f"evtd_{k:026d}"

    @staticmethod
    def tenant_of(k: int) -> str:
        return f"tenant_{k % TENANTS:03d}"


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str

    @property
    def postgres(self) -> bool:
        return self.name == "postgres"

    def series(self, lo: int, hi: int) -> str:
        if self.postgres:
            return f"generate_series({lo}::bigint, {hi}::bigint) AS s(g)"
        return (
            f"(WITH RECURSIVE s(g) AS (SELECT {lo} UNION ALL SELECT g + 1 FROM s WHERE g < {hi})"
            " SELECT g FROM s) AS s"
        )

    def hex_id(self, prefix: str, expr: str) -> str:
        """``prefix`` and ``expr`` as 26 hex digits (:meth:`Shape.delivery_id`)."""
        if self.postgres:
            return f"'{prefix}' || lpad(to_hex({expr}), 26, '0')"
        return f"printf('{prefix}%026x', {expr})"

    def dec_id(self, prefix: str, expr: str, width: int) -> str:
        if self.postgres:
            return f"'{prefix}' || lpad(({expr})::text, {width}, '0')"
        return f"printf('{prefix}%0{width}d', {expr})"

    def iso(self, expr: str) -> str:
        if self.postgres:
            return (
                f"to_char(to_timestamp({expr}) AT TIME ZONE 'UTC',"
                ' \'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\')'
            )
        return f"strftime('%Y-%m-%dT%H:%M:%fZ', {expr}, 'unixepoch')"


def _f(value: float) -> str:
    """A float literal both dialects read as double precision."""
    return f"CAST({value!r} AS DOUBLE PRECISION)"


def deliveries_sql(dialect: Dialect, shape: Shape, lo: int, hi: int) -> str:
    """Insert deliveries ``lo``..``hi`` (1-based row numbers ``g``) of ``shape``.

    Integer hashes of ``g`` spread the rows: ``h`` (uniform in 0..1,000,002) picks
    the destination as ``D·(h/M)²`` (destination 0 the busiest), ``u`` the status
    and ``v`` the state of a pending delivery."""
    m = 1_000_003
    now = _f(shape.now)
    s1 = (
        f"SELECT g, (g * 2654435761) % {m} AS h, (g * 2246822519) % 1000 AS u,"
        f" (g * 3266489917) % 100 AS v,"
        f" {_f(shape.start)} + g * {_f(SPAN_DAYS * DAY / shape.rows)} AS c"
        f" FROM {dialect.series(lo, hi)}"
    )
    s2 = (
        f"SELECT g, c, v, h * h * {DESTINATIONS} / {m * m} AS d,"
        f" CASE WHEN g > {shape.pending_after} AND u < {PENDING_PERMILLE} THEN 'pending'"
        f" WHEN u >= {1000 - FAILURE_PERMILLE} THEN 'failure' ELSE 'success' END AS st"
        f" FROM ({s1}) s1"
    )
    s3 = (
        "SELECT g, c, v, d, st, CASE WHEN st <> 'pending' THEN ''"
        f" WHEN d % {PAUSED_EVERY} = {PAUSED_EVERY - 1} THEN 'held'"
        " WHEN v < 20 THEN 'due' WHEN v < 90 THEN 'retry' ELSE 'leased' END AS ph"
        f" FROM ({s2}) s2"
    )
    s4 = (
        "SELECT g, c, v, d, st, ph, CASE WHEN st = 'success' THEN 1"
        f" WHEN st = 'failure' THEN {MAX_ATTEMPTS} WHEN ph = 'held' THEN 0 ELSE 1 + v % 5 END"
        f" AS n FROM ({s3}) s3"
    )
    return (
        "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id,"
        " kind, status, attempt_count, max_attempts, next_attempt_at, held, lease_owner,"
        " created_at, updated_at, last_attempt_id)"
        f" SELECT {dialect.hex_id('dlv_', 'g')}, {dialect.dec_id('tenant_', f'd % {TENANTS}', 3)},"
        f" {dialect.hex_id('evt_', 'g')},"
        " CASE g % 4 WHEN 0 THEN 'invoice.paid' WHEN 1 THEN 'invoice.created'"
        " WHEN 2 THEN 'customer.updated' ELSE 'task_run.completed' END,"
        f" {dialect.dec_id('evtd_', 'd', 26)}, 'event', st, n, {MAX_ATTEMPTS},"
        f" CASE ph WHEN '' THEN NULL WHEN 'held' THEN c + 60 WHEN 'due' THEN {now} - g % 600"
        f" WHEN 'retry' THEN {now} + 1 + (g * 7) % 21600 ELSE {now} + g % 300 END,"
        f" CASE WHEN ph = 'held' THEN 1 ELSE 0 END,"
        f" CASE WHEN ph = 'leased' THEN '{LEASE_OWNER}' END, c,"
        f" CASE st WHEN 'success' THEN c + 0.5 + (g % 3000) * {_f(0.001)}"
        " WHEN 'failure' THEN c + 600 + g % 3000 ELSE c + 1 END,"
        f" CASE WHEN n > 0 THEN {dialect.hex_id('att_', 'g')} END"
        f" FROM ({s4}) s4"
    )


def attempts_sql(lo: int, hi: int) -> str:
    """The last attempt of every attempted delivery among rows ``lo``..``hi``."""
    return (
        "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
        " response_status, error, response_excerpt)"
        f" SELECT last_attempt_id, id, attempt_count, updated_at - 0.25, {_f(180.0)},"
        " CASE status WHEN 'success' THEN 'success' ELSE 'failure_retryable' END,"
        " CASE status WHEN 'success' THEN 200 ELSE 503 END,"
        " CASE status WHEN 'success' THEN NULL ELSE 'HTTP 503 Service Unavailable' END, NULL"
        " FROM herald_deliveries WHERE last_attempt_id IS NOT NULL"
        f" AND id BETWEEN '{Shape.delivery_id(lo)}' AND '{Shape.delivery_id(hi)}'"
    )


def events_sql(dialect: Dialect, lo: int, hi: int) -> str:
    """The events of the pending deliveries among rows ``lo``..``hi``."""
    return (
        "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts,"
        f" ingested_at) SELECT event_id, tenant_id, event_type, '{EVENT_DATA}',"
        f" {dialect.iso('created_at')}, created_at, created_at FROM herald_deliveries"
        f" WHERE status = 'pending' AND id BETWEEN '{Shape.delivery_id(lo)}'"
        f" AND '{Shape.delivery_id(hi)}'"
    )


def chunks(rows: int, size: int = CHUNK) -> list[tuple[int, int]]:
    return [(lo, min(lo + size - 1, rows)) for lo in range(1, rows + 1, size)]


CENSUS = (
    "SELECT status, held, lease_owner IS NOT NULL, CASE WHEN next_attempt_at IS NULL THEN NULL"
    " WHEN next_attempt_at <= {now} THEN 'due' ELSE 'later' END, COUNT(*)"
    " FROM herald_deliveries GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
)


BUSIEST = (
    "SELECT COUNT(*), SUM(CASE WHEN status = 'failure' THEN 1 ELSE 0 END)"
    " FROM herald_deliveries WHERE destination_id = ? AND tenant_id = ?"
)
_BUSIEST_ARGS = (Shape.destination(0), Shape.tenant_of(0))


def _census(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for status, held, leased, due, n in rows:
        if status != "pending":
            key = str(status)
        elif held:
            key = "pending_held"
        elif leased:
            key = "pending_leased"
        else:
            key = "pending_due" if due == "due" else "pending_scheduled_retry"
        out[key] = out.get(key, 0) + int(n)
    return out


# --- loading ------------------------------------------------------------------------------
@dataclass(slots=True)
class Loaded:
    rows: int
    seconds: float = 0.0
    index_seconds: float = 0.0
    census: dict[str, int] = field(default_factory=dict)
    busiest: dict[str, int] = field(default_factory=dict)
    note: str = ""


_PG_INDEXES = (
    "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
    " JOIN pg_class c ON c.oid = i.indexrelid"
    " WHERE i.indrelid = ANY($1::regclass[]) AND NOT i.indisprimary ORDER BY 1"
)


async def load_postgres(
    conn: asyncpg.Connection, shape: Shape, deadline: Deadline | None = None
) -> Loaded:
    """Fill a migrated, empty database with ``shape``; then ``VACUUM ANALYZE``."""
    dialect = Dialect("postgres")
    t0 = time.perf_counter()
    indexes = await conn.fetch(_PG_INDEXES, list(_SIZE_TABLES))
    for name, _ in indexes:
        await conn.execute(f"DROP INDEX {name}")
    for lo, hi in chunks(shape.rows):
        if deadline is not None:
            deadline.check(f"{lo - 1:,} rows loaded")
        async with conn.transaction():
            await conn.execute(deliveries_sql(dialect, shape, lo, hi))
            await conn.execute(attempts_sql(lo, hi))
            await conn.execute(events_sql(dialect, lo, hi))
        if shape.rows > CHUNK:
            log(f"postgres: {hi:,} rows in {time.perf_counter() - t0:.0f} s")
    t1 = time.perf_counter()
    await conn.execute("SET maintenance_work_mem = '256MB'")
    for _, definition in indexes:
        if deadline is not None:
            deadline.check("rebuilding indexes")
        await conn.execute(definition)
    for table in _SIZE_TABLES:
        await conn.execute(f"VACUUM ANALYZE {table}")
    loaded = Loaded(shape.rows, seconds=time.perf_counter() - t0)
    loaded.index_seconds = time.perf_counter() - t1
    loaded.census = _census(await conn.fetch(CENSUS.format(now=shape.now)))
    row = await conn.fetchrow(BUSIEST.replace("?", "$1", 1).replace("?", "$2"), *_BUSIEST_ARGS)
    loaded.busiest = {"deliveries": int(row[0]), "failures": int(row[1] or 0)}
    return loaded


def load_sqlite(
    path: Path, shape: Shape, deadline: Deadline | None = None, *, budget: float | None = None
) -> Loaded:
    """Fill a migrated, empty SQLite file with ``shape`` (no ``ANALYZE``, as Herald runs none).

    With ``budget``, give up after the first chunk if the whole load would take
    longer: the returned ``rows`` is then 0 and the file is left half filled."""
    dialect = Dialect("sqlite")
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # A throwaway file: no journal, no fsync; WAL again at the end, as Herald has it.
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-262144")
        marks = ",".join("?" * len(_SIZE_TABLES))
        indexes = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            f" AND tbl_name IN ({marks}) ORDER BY name",
            _SIZE_TABLES,
        ).fetchall()
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        parts = chunks(shape.rows)
        for n, (lo, hi) in enumerate(parts):
            if deadline is not None:
                deadline.check(f"{lo - 1:,} rows loaded")
            conn.execute("BEGIN")
            conn.execute(deliveries_sql(dialect, shape, lo, hi))
            conn.execute(attempts_sql(lo, hi))
            conn.execute(events_sql(dialect, lo, hi))
            conn.execute("COMMIT")
            elapsed = time.perf_counter() - t0
            if shape.rows > CHUNK:
                log(f"sqlite: {hi:,} rows in {elapsed:.0f} s")
            # Rebuilding the indexes takes about as long again as the inserts.
            if n == 0 and budget is not None and elapsed * len(parts) * 2 > budget:
                log(f"sqlite: {shape.rows:,} rows would take ~{elapsed * len(parts) * 2:.0f} s")
                return Loaded(0)
        t1 = time.perf_counter()
        for _, definition in indexes:
            if deadline is not None:
                deadline.check("rebuilding indexes")
            conn.execute(definition)
        conn.execute("PRAGMA journal_mode=WAL")
        loaded = Loaded(shape.rows, seconds=time.perf_counter() - t0)
        loaded.index_seconds = time.perf_counter() - t1
        loaded.census = _census(conn.execute(CENSUS.format(now=shape.now)).fetchall())
        count, failures = conn.execute(BUSIEST, _BUSIEST_ARGS).fetchone()
        loaded.busiest = {"deliveries": int(count), "failures": int(failures or 0)}
        return loaded
    finally:
        conn.close()


# --- recording what the store sends -----------------------------------------------------
@dataclass(frozen=True, slots=True)
class Statement:
    """One statement as the store sent it: its SQL and its parameters."""

    sql: str
    params: tuple[Any, ...]


class _RecordingConnection:
    """A connection of the SQLite store that notes every statement (``execute``, and
    ``execute_fetchall``, which the store's reads use) before passing it on."""

    def __init__(self, conn: Any, sent: list[Statement]) -> None:
        self._conn = conn
        self._sent = sent

    def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> Any:
        self._sent.append(Statement(sql, tuple(parameters or ())))
        return self._conn.execute(sql, parameters or ())

    def execute_fetchall(self, sql: str, parameters: Iterable[Any] | None = None) -> Any:
        self._sent.append(Statement(sql, tuple(parameters or ())))
        return self._conn.execute_fetchall(sql, parameters or ())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _recording_method(method: Any, sent: list[Statement]) -> Any:
    """``InThread``'s statement ``method``, noting each statement first."""

    async def noted(self: Any, sql: str, parameters: Iterable[Any] | None = None) -> Any:
        sent.append(Statement(sql, tuple(parameters or ())))
        return await method(self, sql, parameters or ())

    return noted


@contextlib.asynccontextmanager
async def recording(store: Store) -> AsyncIterator[list[Statement]]:
    """Every statement ``store`` sends meanwhile, in order, with its parameters.

    PostgreSQL: asyncpg's query logger on each of the pool's connections (it calls
    back soon after each statement: yield to the loop before reading). SQLite: the
    three connections of the store's dialect wrapped for the duration."""
    from herald.store.postgres import PostgresStore
    from herald.store.sqlite import SQLiteStore
    from herald.store.sqlitethread import InThread

    sent: list[Statement] = []
    if isinstance(store, PostgresStore):
        pool = store.pool

        def note(query: Any) -> None:
            sent.append(Statement(query.query, tuple(query.args or ())))

        async def each_connection(action: Callable[[Any], None]) -> None:
            held = [await pool.acquire() for _ in range(pool.get_max_size())]
            for conn in held:
                action(conn)
                await pool.release(conn)

        await each_connection(lambda conn: conn.add_query_logger(note))
        try:
            yield sent
        finally:
            await asyncio.sleep(0)
            await each_connection(lambda conn: conn.remove_query_logger(note))
    elif isinstance(store, SQLiteStore):
        names = ("_w", "_r", "_g")
        dialect = store.dialect
        originals = {name: getattr(dialect, name) for name in names}
        for name, conn in originals.items():
            setattr(dialect, name, _RecordingConnection(conn, sent))
        # A transaction body run in the writer's thread gets its statements there.
        in_thread = {name: getattr(InThread, name) for name in ("execute", "execute_fetchall")}
        for name, method in in_thread.items():
            setattr(InThread, name, _recording_method(method, sent))
        try:
            yield sent
        finally:
            for name, conn in originals.items():
                setattr(dialect, name, conn)
            for name, method in in_thread.items():
                setattr(InThread, name, method)
    else:
        raise TypeError(f"cannot record the statements of {type(store).__name__}")


# A call that sends more than one statement on herald_deliveries, and how to tell the
# one measured: a replay's dry run sends its count and its sample (at once, on
# PostgreSQL's pool, so in either order).
# A claim reads the flow lanes' heads first (``flow_due``, herald_flow whole and a probe
# of herald_deliveries_flow each), then the common lane: the statement with the LIMIT.
_ONE_OF_SEVERAL = {
    "count_deliveries": "COUNT(",
    "claim_due": "LIMIT",
    "claim_due_excluding": "LIMIT",
}
_TABLE = {"list_events": "herald_events"}
"""The table a call's measured statement reads, when not ``herald_deliveries``."""


def _deliveries_statement(sent: Sequence[Statement], what: str) -> Statement:
    """The first statement that reads ``herald_deliveries`` (or the call's table in
    :data:`_TABLE`), transaction control aside."""
    marker = _ONE_OF_SEVERAL.get(what, "")
    table = _TABLE.get(what, "herald_deliveries")
    for stmt in sent:
        if table in stmt.sql and marker in stmt.sql.upper():
            return stmt
    raise BenchError(f"{what}: the store sent no statement on {table}: {sent}")


def settings_for(url: str) -> Settings:
    """Herald's defaults (claim batch, lease, retention) on the database at ``url``."""
    from herald.config import Settings
    from herald.crypto import generate_key

    data: dict[str, Any] = {
        "database": {"url": url, "pool_size": 2},
        "security": {"encryption_key": generate_key()},
    }
    return Settings(**data)


async def capture(comp: Components, shape: Shape) -> dict[str, Statement]:
    """Make each call of :data:`QUERIES` through Herald's own code; the statement each
    sent on ``herald_deliveries``. The claims lease 2 × ``claim_batch_size`` due
    deliveries and the purge deletes a batch, as they would in production."""
    from herald.api.request import DEFAULT_LIMIT
    from herald.model import DeliveryFilter, DeliveryStatus
    from herald.store.recent import EventsPage

    store, service, settings = comp.store, comp.service, comp.settings
    delivery, retention = settings.delivery, settings.retention
    flt = DeliveryFilter(
        tenant_id=Shape.tenant_of(0),
        destination_id=Shape.destination(0),
        status=DeliveryStatus.FAILURE,
    )
    page, more = await service.list_deliveries(flt, limit=DEFAULT_LIMIT)
    if not more:
        raise BenchError(f"the busiest destination has only {len(page)} failed deliveries")
    cursor = page[-1].id  # what the API's next-page cursor carries
    events, more = await service.recent_events(Shape.tenant_of(0), type="invoice.paid", limit=50)
    if not more:
        raise BenchError(f"the busiest tenant has only {len(events)} invoice.paid events")
    after = EventsPage(events[-1].ingested_at, events[-1].id, events[-1].tenant_id)

    def claim(exclude: Sequence[str]) -> Callable[[], Awaitable[object]]:
        return lambda: store.claim_due(
            now=shape.now,
            limit=delivery.claim_batch_size,
            owner="bench-query-plans",
            lease_until=shape.now + delivery.lease_seconds,
            exclude_destinations=exclude,
        )

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "claim_due": claim(()),
        "claim_due_excluding": claim([Shape.destination(k) for k in range(SATURATED)]),
        "next_due_at": store.next_due_at,
        "list_deliveries": lambda: service.list_deliveries(
            flt, before_id=cursor, limit=DEFAULT_LIMIT
        ),
        "count_deliveries": lambda: service.replays.run(flt, by="bench", dry_run=True),
        "purge_select": lambda: store.purge(
            before=shape.now - retention.days * DAY, limit=retention.batch_size
        ),
        "last_failed_attempt": lambda: store.last_failed_attempt(Shape.destination(FAILING)),
        "list_events": lambda: service.recent_events(
            Shape.tenant_of(0), type="invoice.paid", after=after, limit=50
        ),
    }
    out: dict[str, Statement] = {}
    for name, call in calls.items():
        async with recording(store) as sent:
            await call()
            await asyncio.sleep(0)  # asyncpg's query logger calls back on the next turn
        out[name] = _deliveries_statement(sent, name)
    return out


# --- explaining and timing ------------------------------------------------------------------
@dataclass(slots=True)
class Explained:
    statement: Statement
    plan: list[str]
    scans: list[str]
    """Each table access: ``Index Scan using herald_deliveries_pending on herald_deliveries``,
    ``SEARCH herald_deliveries USING INDEX …``."""
    full_scans: list[str]
    """The accesses that read a whole table or a whole index: ``Seq Scan``, an index scan
    with no ``Index Cond``, SQLite's ``SCAN`` (a ``SEARCH`` is bounded by its constraint)."""
    execution_ms: float | None = None
    planning_ms: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)

    @property
    def indexes(self) -> list[str]:
        """The indexes the plan reads, in plan order."""
        found: list[str] = []
        for line in self.scans:
            for name in _INDEX.findall(line):
                if name not in found:
                    found.append(name)
        return found


def _postgres_scans(plan: Sequence[str]) -> tuple[list[str], list[str]]:
    """(every scan, the unbounded ones) of a text ``EXPLAIN``: a node's details (its
    ``Index Cond``) are the lines after it up to the next node."""
    scans: list[str] = []
    full: list[str] = []
    for i, line in enumerate(plan):
        m = _PG_SCAN.search(line)
        if m is None:
            continue
        scan = m.group(1).strip()
        scans.append(scan)
        details = []
        for after in plan[i + 1 :]:
            if "->" in after or not after.startswith(" "):
                break
            details.append(after.strip())
        bounded = any(d.startswith("Index Cond:") for d in details)
        if "Seq Scan" in scan or not bounded:
            full.append(scan)
    return scans, full


_INDEX = re.compile(r"(?:\busing |USING (?:COVERING )?INDEX |^Bitmap Index Scan on )(\S+)")
_PG_SCAN = re.compile(r"((?:Parallel )?(?:Seq|Index|Index Only|Bitmap Index) Scan.*?)(?:  \(|$)")


def _ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(percentile(ordered, 95) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
        "n": len(ordered),
    }


def _writes(stmt: Statement) -> bool:
    """An ``UPDATE`` or a ``SELECT … FOR UPDATE``: run it in a transaction rolled back."""
    return not stmt.sql.lstrip().upper().startswith("SELECT") or "FOR UPDATE" in stmt.sql


async def explain_postgres(
    conn: asyncpg.Connection, stmt: Statement, *, analyze: bool, repeat: int = 0
) -> Explained:
    """The plan of ``stmt`` with its parameters; with ``analyze``, run (a write in a
    transaction rolled back) once to warm up, then ``EXPLAIN (ANALYZE, BUFFERS)``,
    then ``repeat`` times for its latency. ``conn`` should have the store's
    ``SESSION_SETTINGS``."""

    writes = _writes(stmt)

    async def run(sql: str) -> list[Any]:
        if not writes:
            return list(await conn.fetch(sql, *stmt.params))
        tx = conn.transaction()
        await tx.start()
        try:
            return list(await conn.fetch(sql, *stmt.params))
        finally:
            await tx.rollback()

    if analyze:
        await run(stmt.sql)
        rows = await run("EXPLAIN (ANALYZE, BUFFERS) " + stmt.sql)
    else:
        rows = await conn.fetch("EXPLAIN " + stmt.sql, *stmt.params)
    plan = [str(r[0]) for r in rows]
    out = Explained(stmt, plan, *_postgres_scans(plan))
    for line in plan:
        if m := re.match(r"(Planning|Execution) Time: ([\d.]+) ms", line.strip()):
            setattr(out, f"{m.group(1).lower()}_ms", float(m.group(2)))
    if repeat:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await run(stmt.sql)
            times.append(time.perf_counter() - t0)
        out.latency_ms = _ms(times)
    return out


def explain_sqlite(conn: sqlite3.Connection, stmt: Statement, *, repeat: int = 0) -> Explained:
    """``EXPLAIN QUERY PLAN`` of ``stmt`` as a tree; ``repeat`` runs (writes rolled back)
    after one warm-up for its latency."""
    depth: dict[int, int] = {0: -1}
    plan: list[str] = []
    for node, parent, _, detail in conn.execute("EXPLAIN QUERY PLAN " + stmt.sql, stmt.params):
        depth[node] = depth.get(parent, -1) + 1
        plan.append("  " * depth[node] + str(detail))
    scans = [p.strip() for p in plan if p.strip().startswith(("SCAN", "SEARCH"))]
    out = Explained(stmt, plan, scans, [p for p in scans if p.startswith("SCAN")])
    if repeat:
        writes = _writes(stmt)

        def run() -> None:
            if not writes:
                conn.execute(stmt.sql, stmt.params).fetchall()
                return
            conn.execute("BEGIN")
            try:
                conn.execute(stmt.sql, stmt.params).fetchall()
            finally:
                conn.execute("ROLLBACK")

        run()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        out.latency_ms = _ms(times)
    return out


# --- one backend ----------------------------------------------------------------------------
async def postgres_plans(
    url: str, shape: Shape, *, analyze: bool, repeat: int = 0, deadline: Deadline | None = None
) -> tuple[Loaded, dict[str, Explained], dict[str, Any]]:
    """Migrate the empty database at ``url``, load ``shape``, capture and explain."""
    import asyncpg

    from herald.store.postgres import SESSION_SETTINGS
    from herald.wiring import components

    settings = settings_for(url)
    async with components(settings):
        pass  # the migrations
    conn = await asyncpg.connect(url, server_settings=SESSION_SETTINGS)
    try:
        loaded = await load_postgres(conn, shape, deadline)
        async with components(settings) as comp:
            statements = await capture(comp, shape)
        plans = {}
        for name, stmt in statements.items():
            if deadline is not None:
                deadline.check(f"explaining {name}")
            plans[name] = await explain_postgres(conn, stmt, analyze=analyze, repeat=repeat)
        extra: dict[str, Any] = {}
        if analyze:
            extra["sizes_mb"] = await _pg_sizes(conn)
            extra["server"] = {
                n: await conn.fetchval(f"SHOW {n}")
                for n in ("server_version", "shared_buffers", "work_mem", "random_page_cost")
            }
        return loaded, plans, extra
    finally:
        await conn.close()


async def _pg_sizes(conn: asyncpg.Connection) -> dict[str, float]:
    rows = await conn.fetch(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')"
        " AND (c.relname = ANY($1) OR c.oid IN (SELECT indexrelid FROM pg_index"
        "   WHERE indrelid = ANY($1::regclass[]))) ORDER BY 2 DESC",
        list(_SIZE_TABLES),
    )
    sizes = {str(r[0]): round(r[1] / 2**20, 1) for r in rows}
    total = await conn.fetchval("SELECT pg_database_size(current_database())")
    sizes["database"] = round(total / 2**20, 1)
    return sizes


async def sqlite_plans(
    path: Path,
    shape: Shape,
    *,
    repeat: int = 0,
    deadline: Deadline | None = None,
    budget: float | None = None,
) -> tuple[Loaded, dict[str, Explained], dict[str, Any]]:
    """As :func:`postgres_plans` on a new SQLite file at ``path``; with ``budget``, a
    load projected to exceed it gives ``Loaded(0)`` and no plans."""
    from herald.wiring import components

    settings = settings_for(f"sqlite:///{path}")
    async with components(settings):
        pass
    loaded = await asyncio.to_thread(load_sqlite, path, shape, deadline, budget=budget)
    if not loaded.rows:
        return loaded, {}, {}
    async with components(settings) as comp:
        statements = await capture(comp, shape)
    plans, extra = await asyncio.to_thread(_explain_sqlite_file, path, statements, repeat)
    return loaded, plans, extra


def _explain_sqlite_file(
    path: Path, statements: dict[str, Statement], repeat: int
) -> tuple[dict[str, Explained], dict[str, Any]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        plans = {n: explain_sqlite(conn, s, repeat=repeat) for n, s in statements.items()}
        extra: dict[str, Any] = {}
        if repeat:
            sizes = conn.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
            ).fetchall()
            extra["sizes_mb"] = {
                str(n): round(b / 2**20, 1)
                for n, b in sizes
                if str(n).startswith(
                    (*_SIZE_TABLES, *(f"sqlite_autoindex_{t}_" for t in _SIZE_TABLES))
                )
            }
            extra["sizes_mb"]["file"] = round(path.stat().st_size / 2**20, 1)
            extra["server"] = {"sqlite_version": sqlite3.sqlite_version}
        return plans, extra
    finally:
        conn.close()


async def plans_for(
    url: str, shape: Shape, *, analyze: bool = False, repeat: int = 0
) -> dict[str, Explained]:
    """The plans of :data:`QUERIES` on the migrated, empty database at ``url``
    (``sqlite:///…`` or ``postgresql://…``) once ``shape`` is loaded into it."""
    if url.startswith("sqlite:///"):
        _, plans, _ = await sqlite_plans(Path(url.removeprefix("sqlite:///")), shape, repeat=repeat)
    else:
        _, plans, _ = await postgres_plans(url, shape, analyze=analyze, repeat=repeat)
    return plans


def run_backend(kind: str, args: argparse.Namespace, rows: int) -> dict[str, Any]:
    from bench.db import postgres_database

    deadline = Deadline(f"{kind}", args.timeout)
    shape = Shape(rows=rows, now=time.time())
    log(f"{kind}: loading {rows:,} deliveries")
    if kind == "postgres":
        with postgres_database("herald_bench_plans") as db:
            loaded, plans, extra = asyncio.run(
                postgres_plans(db.url, shape, analyze=True, repeat=args.repeat, deadline=deadline)
            )
    else:
        with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
            path = Path(scratch) / "herald.db"
            budget = None if args.quick else args.sqlite_budget
            loaded, plans, extra = asyncio.run(
                sqlite_plans(path, shape, repeat=args.repeat, deadline=deadline, budget=budget)
            )
        if not loaded.rows:
            note = (
                f"loading {rows:,} rows into SQLite would exceed --sqlite-budget"
                f" ({args.sqlite_budget:g} s): {SQLITE_FALLBACK:,} rows instead"
            )
            log(f"sqlite: {note}")
            shape = Shape(rows=SQLITE_FALLBACK, now=time.time())
            with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
                path = Path(scratch) / "herald.db"
                loaded, plans, extra = asyncio.run(
                    sqlite_plans(path, shape, repeat=args.repeat, deadline=deadline)
                )
            loaded.note = note
    log(f"{kind}: loaded in {loaded.seconds:.0f} s (indexes {loaded.index_seconds:.0f} s)")
    return {
        "backend": kind,
        "rows": loaded.rows,
        "rows_note": loaded.note or None,
        "load_seconds": round(loaded.seconds, 1),
        "index_build_seconds": round(loaded.index_seconds, 1),
        "deliveries_by_state": loaded.census,
        "busiest_destination": {
            "id": Shape.destination(0),
            "tenant": Shape.tenant_of(0),
            **loaded.busiest,
        },
        "queries": {
            name: {
                "sql": e.statement.sql,
                "params": [_param(p) for p in e.statement.params],
                "plan": e.plan,
                "indexes": e.indexes,
                "full_scans": e.full_scans,
                "planning_ms": e.planning_ms,
                "execution_ms": e.execution_ms,
                "latency": e.latency_ms,
            }
            for name, e in plans.items()
        },
        **extra,
    }


def _param(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_param(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    return repr(value)


# --- output ---------------------------------------------------------------------------------
def _summary_rows(results: dict[str, dict[str, Any]]) -> list[list[object]]:
    pg, lite = results.get("postgres"), results.get("sqlite")
    out: list[list[object]] = []
    for name in QUERIES:
        row: list[object] = [name]
        if pg:
            q = pg["queries"][name]
            row += [
                ", ".join(q["indexes"]) or "-",
                q["execution_ms"] if q["execution_ms"] is not None else "-",
                q["latency"]["p50_ms"],
                q["latency"]["p95_ms"],
            ]
        if lite:
            q = lite["queries"][name]
            row += [", ".join(q["indexes"]) or "-", q["latency"]["p50_ms"], q["latency"]["p95_ms"]]
        out.append(row)
    return out


def _summary_header(results: dict[str, dict[str, Any]]) -> list[str]:
    header = ["query"]
    if "postgres" in results:
        header += ["PostgreSQL reads", "EXPLAIN ANALYZE ms", "pg p50 ms", "pg p95 ms"]
    if "sqlite" in results:
        header += ["SQLite reads", "sqlite p50 ms", "sqlite p95 ms"]
    return header


def _print(results: dict[str, dict[str, Any]]) -> None:
    print(grid(_summary_header(results), _summary_rows(results)))
    for kind, r in results.items():
        full = {n: q["full_scans"] for n, q in r["queries"].items() if q["full_scans"]}
        if full:
            print(f"\n{kind}: FULL SCANS: {full}")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.1f}" if v >= 100 else f"{v:.3g}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]


def _shown(params: Sequence[Any]) -> str:
    parts = []
    for i, p in enumerate(params, 1):
        text = repr(p)
        parts.append(f"${i} = {text if len(text) <= 120 else text[:117] + '...'}")
    return "; ".join(parts) or "(none)"


def render_doc(result: dict[str, Any]) -> str:
    from herald.config import RetentionSettings

    retention_days = RetentionSettings().days
    results: dict[str, dict[str, Any]] = result["backends"]
    pg, lite = results.get("postgres"), results.get("sqlite")
    rows = result["rows"]
    lines = [
        f"# Query plans at {rows:,} deliveries",
        "",
        f"Generated by `python -m bench {NAME}` ([bench/query_plans.py](../bench/query_plans.py))"
        f" on {result['date']}, {result['machine']}; the numbers are in"
        f" [bench/results/{NAME}.json](../bench/results/{NAME}.json). Regenerate rather than"
        " edit.",
        "",
        "The SQL below is not copied from the code: the benchmark makes each call through"
        " Herald's own store and service (`herald.wiring.components`), records at the driver the"
        " statement the store sends and its parameters (asyncpg's query logger; a wrapper around"
        " the SQLite store's connections), then explains and times exactly that."
        " [tests/integration/test_query_plans.py](../tests/integration/test_query_plans.py)"
        " runs the same scenario at 200,000 rows on both backends and fails when a plan stops"
        " reading its index, so a change to a store's SQL that loses an index is caught.",
        "",
        "| query | Herald call |",
        "|---|---|",
        *(f"| `{n}` | `{CALLS[n]}` |" for n in QUERIES),
        "",
        "## The data",
        "",
        f"{rows:,} deliveries created over {SPAN_DAYS:g} days with time-ordered ids, to"
        f" {DESTINATIONS} destinations of {TENANTS} tenants, skewed like real traffic (the"
        " busiest destination gets 4.5 % of all deliveries, the quietest 0.1 %). 95 % are"
        " finished (2 % of all `failure`); the other 5 %, all in the newest quarter, are a retry"
        " backlog: due now, scheduled retries up to 6 h ahead, leased by a running instance,"
        f" and held (every {PAUSED_EVERY}th destination is paused). Every attempted delivery"
        " has its last attempt in `herald_attempts`, every pending one its event in"
        f" `herald_events`. Retention is at its default ({retention_days:g} days), so the"
        f" oldest {SPAN_DAYS - retention_days:g} days are due for the purge. Rows are inserted"
        " in the database (`generate_series` / recursive CTE) with the secondary indexes"
        " dropped and rebuilt from their migration definitions afterwards; PostgreSQL then"
        " gets `VACUUM ANALYZE` (what autovacuum would have done), SQLite nothing (Herald"
        " runs no `ANALYZE` on it).",
        "",
    ]
    states = sorted({k for r in results.values() for k in r["deliveries_by_state"]})
    lines += _md_table(
        ["deliveries", *results],
        [
            *([s, *(r["deliveries_by_state"].get(s, 0) for r in results.values())] for s in states),
            [
                "busiest destination",
                *(r["busiest_destination"]["deliveries"] for r in results.values()),
            ],
            [
                "… of which `failure`",
                *(r["busiest_destination"]["failures"] for r in results.values()),
            ],
            ["load seconds (indexes incl.)", *(r["load_seconds"] for r in results.values())],
        ],
    )
    for kind, r in results.items():
        if r["rows_note"]:
            lines += ["", f"**{kind}: {r['rows_note']}.**"]
    lines += [
        "",
        "## Summary",
        "",
        "“reads” is the indexes the plan reads; “EXPLAIN ANALYZE ms” PostgreSQL's execution"
        " time of the statement under `EXPLAIN (ANALYZE, BUFFERS)`; p50/p95 the latency of"
        f" {result['repeat']} executions of the statement with its parameters from a client"
        " (asyncpg; Python's sqlite3), after one warm-up, each write in a transaction rolled"
        " back.",
        "",
        *_md_table(_summary_header(results), _summary_rows(results)),
        "",
    ]
    for name in QUERIES:
        lines += [f"## `{name}`", "", f"`{CALLS[name]}`. {NOTES[name]}", ""]
        for kind, r in results.items():
            q = r["queries"][name]
            lines += [
                f"**{kind}** — the statement as sent:",
                "",
                "```sql",
                q["sql"],
                "```",
                "",
                f"Parameters: {_shown(q['params'])}",
                "",
            ]
            if kind == "postgres":
                lines += ["`EXPLAIN (ANALYZE, BUFFERS)`:"]
            else:
                lines += ["`EXPLAIN QUERY PLAN`:"]
            lines += ["", "```", *q["plan"], "```", ""]
    lines += ["## Sizes (MiB)", ""]
    for kind, r in results.items():
        sizes = r.get("sizes_mb") or {}
        lines += [f"{kind}:", "", *_md_table(["relation", "MiB"], list(sizes.items())), ""]
    if pg:
        server = ", ".join(f"{k} {v}" for k, v in pg.get("server", {}).items())
        lines += [f"PostgreSQL: {server}; autovacuum off on the bench server."]
    if lite:
        lines += [f"SQLite {lite.get('server', {}).get('sqlite_version', '?')}."]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows, smoke test")
    parser.add_argument("--rows", type=int, default=None, help=f"deliveries ({ROWS:,})")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="(%(default)s)")
    parser.add_argument(
        "--repeat", type=int, default=REPEAT, help="timed runs per statement (%(default)s)"
    )
    parser.add_argument(
        "--sqlite-budget",
        type=float,
        default=SQLITE_BUDGET,
        help=f"seconds SQLite may take to load; else {SQLITE_FALLBACK:,} rows (%(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds per backend (%(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    from herald.logs import set_level

    set_level("warning")  # the replay dry run logs a line
    quick = args.quick
    rows = args.rows or (QUICK_ROWS if quick else ROWS)
    kinds = [k.strip() for k in args.backends.split(",") if k.strip()]
    if not kinds or set(kinds) - set(BACKENDS):
        raise BenchError(f"--backends: expected some of {', '.join(BACKENDS)}")
    load_before = load_avg()
    results = {kind: run_backend(kind, args, rows) for kind in kinds}
    print(f"\nquery plans at {rows:,} deliveries; {machine()}")
    for kind, r in results.items():
        if r["rows_note"]:
            print(f"NOTE ({kind}): {r['rows_note']}")
    print()
    _print(results)
    result: dict[str, Any] = {
        "rows": rows,
        "repeat": args.repeat,
        "backends": results,
        "date": iso_now(),
        "machine": machine(),
        "load_avg_1m": [load_before, load_avg()],
    }
    if quick:
        result["quick"] = True
    path = write_named(NAME, result, quick=quick)
    doc = DOC if not quick else path.with_name("query-plans.md")
    doc.write_text(render_doc(result))
    print(f"wrote {doc.relative_to(REPO_ROOT)}")
    return 0
