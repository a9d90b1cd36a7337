"""Retention at scale: purging 1,000,000 finished deliveries, and what it costs the scheduler.

For each backend (PostgreSQL, then SQLite) a fresh database is created with
``herald migrate`` and filled directly with SQL (``generate_series`` on
PostgreSQL, ``executemany`` in 50,000-row transactions on SQLite):

- N finished deliveries (1,000,000 by default; 2 % ``failure``, the rest
  ``success``) last changed 40-41 days ago, each with its ``herald_events``
  row and one ``herald_attempts`` row, in time order (events ingested about
  11 per second over one day, each delivery finished 0.5-3.5 s later);
- N / 100 rejected outbox rows of the same age;
- 100,000 pending deliveries in scheduled-retry state (3 attempts made,
  ``next_attempt_at`` 2-6 hours ahead, so nothing is due while the benchmark
  runs), each with its event and its 3 attempt rows. One in ten of them is a
  *replayed* delivery (``herald replay``): its event was ingested 40 days ago
  among the old ones and its first attempt is that old too, so the purge must
  keep an old event because a pending delivery still uses it.

The deliveries name a destination id that has no row: none of the queries
measured here reads ``herald_destinations`` (creating a real one would add a
verification delivery that is due at once).

PostgreSQL then gets ``VACUUM ANALYZE`` (the bench server runs with autovacuum
off; a production server would have analysed the tables); SQLite gets nothing,
as Herald runs no ``ANALYZE`` itself. Then, through Herald's own store
(``herald.wiring.components``), in one event loop as in ``herald run``:

1. baseline: ``claim_due``, ``next_due_at`` and ``delivery_counts`` timed
   ``--repeat`` times each with nothing else running (as ``bench/querytime.py``);
2. purge: ``store.purge(before=now - retention.days, limit=retention.batch_size)``
   (the defaults of ``RetentionSettings``) in a loop until it returns fewer
   than a batch, as the daemon's retention task does, each call timed; beside
   it a second task keeps timing ``claim_due`` and ``next_due_at`` (and
   ``delivery_counts`` every tenth round) on the same store: what the
   dispatcher sees while retention runs. On PostgreSQL these run on other
   pooled connections; on SQLite ``claim_due`` queues on the store's single
   writer, ``next_due_at`` reads on its reader connection.

Reported per backend: total purge seconds, deliveries purged per second, the
per-batch p50/p99/max (and the median of the first and last tenth of the
batches), the scheduling queries' p50/p99 during the purge against the
baseline, table sizes before and after (``pg_total_relation_size``, then after
a plain ``VACUUM``; SQLite's file, page and free-list sizes), and the plans
of the purge's statements at the start and at the end (PostgreSQL: ``EXPLAIN
(ANALYZE, BUFFERS)`` in a rolled-back transaction, custom and generic plans;
SQLite: ``EXPLAIN QUERY PLAN`` and the time of each statement in a
rolled-back transaction). Afterwards every old finished delivery, attempt,
event and rejected row must be gone, and every pending delivery, its event
and its attempts must remain; any difference fails the run.

If the first SQLite chunks show that loading N rows would take longer than
``--insert-budget`` (180 s), 300,000 are loaded instead and the output says so.
Every phase is bounded by ``--timeout`` (the purge by ``--purge-timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import (
    DEFAULT_PHASE_TIMEOUT,
    EVENT_TYPE,
    TENANT,
    BenchError,
    Deadline,
    grid,
    iso_ms,
    iso_now,
    latency_summary,
    load_avg,
    log,
    machine,
    percentile,
    write_named,
)
from bench.daemon import HeraldInstance
from bench.db import Database, postgres_database

if TYPE_CHECKING:
    from herald.store import Store

NAME = "retention"
HELP = "purge 1,000,000 finished deliveries: batch time, scheduling-query latency meanwhile"
ROWS, SQLITE_FALLBACK, QUICK_ROWS = 1_000_000, 300_000, 20_000
PENDING, QUICK_PENDING = 100_000, 5_000
REPLAYED_EVERY = 10
"""One pending delivery in this many is a replay whose event is as old as the purged ones."""
AGE_DAYS = 40.0
DAY = 86_400.0
REPEAT = 50
INSERT_BUDGET = 180.0
PURGE_TIMEOUT = 1800.0
SAMPLE_INTERVAL = 0.02
SQLITE_CHUNK = 50_000
PG_CHUNK = 100_000
DEST_ID = "dst_bench_retention"
OWNER = "bench-retention"
BACKENDS = ("postgres", "sqlite")
STATEMENTS = (
    "select_finished",
    "delete_attempts",
    "delete_deliveries",
    "delete_events",
    "sweep_events",
    "delete_rejected",
)
"""The purge's statements, in the order one batch runs them (``sweep_events``, the
events no delivery ever used, is PostgreSQL's; SQLite does both in ``delete_events``)."""
SCHED_QUERIES = ("claim_due", "next_due_at", "delivery_counts")
TABLES = ("herald_deliveries", "herald_attempts", "herald_events", "herald_outbox_rejected")
DATA_TEMPLATE = (
    '{"task_run_id":"tr_%s","workflow":"nightly-invoice-sync","status":"completed",'
    '"attempt":1,"duration_ms":%s,"finished_at":"2025-06-01T02:30:00.000Z",'
    '"records":{"read":1800,"written":1790,"skipped":3}}'
)
"""About 190 bytes; ``%s`` works for both Python's ``%`` and PostgreSQL's ``format()``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, default=None, help=f"old finished deliveries ({ROWS:,})"
    )
    parser.add_argument(
        "--pending", type=int, default=None, help=f"scheduled retries kept ({PENDING:,})"
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated: postgres, sqlite (%(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="purge limit (retention.batch_size's default)",
    )
    parser.add_argument(
        "--repeat", type=int, default=REPEAT, help="baseline runs per query (%(default)s)"
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=SAMPLE_INTERVAL,
        help="pause between scheduling queries during the purge, s (%(default)s)",
    )
    parser.add_argument(
        "--insert-budget",
        type=float,
        default=INSERT_BUDGET,
        help=f"seconds the SQLite load may take before falling back to {SQLITE_FALLBACK:,}"
        " (%(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ROWS:,} finished + {QUICK_PENDING:,} pending deliveries",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_PHASE_TIMEOUT, help="per phase, s (%(default)s)"
    )
    parser.add_argument(
        "--purge-timeout",
        type=float,
        default=PURGE_TIMEOUT,
        help="for the whole purge, s (%(default)s)",
    )


# --- the data set ---------------------------------------------------------------------
Rows = list[tuple[Any, ...]]
Batch = tuple[Rows, Rows, Rows]
"""Events, deliveries and attempts to insert together."""


@dataclass(frozen=True, slots=True)
class Shape:
    """What is loaded, and the clock every timestamp derives from.

    Old row ``i`` is ingested at ``old_base + i * step`` (one day of history
    for the requested size) and finished 0.5-3.5 s later; the same formulas
    are written once in Python (SQLite) and once in SQL (PostgreSQL).
    """

    requested: int
    pending: int
    now: float

    @property
    def old_base(self) -> float:
        return self.now - (AGE_DAYS + 1) * DAY

    @property
    def step(self) -> float:
        return DAY / max(self.requested, 1)

    @property
    def replayed(self) -> int:
        return self.pending // REPLAYED_EVERY

    @property
    def scheduled(self) -> int:
        return self.pending - self.replayed

    @property
    def rejected(self) -> int:
        return max(self.requested // 100, 1)

    def pg_params(self, lo: int, hi: int) -> dict[str, Any]:
        return {
            "lo": lo,
            "hi": hi,
            "base": self.old_base,
            "step": self.step,
            "now": self.now,
            "tenant": TENANT,
            "type": EVENT_TYPE,
            "dest": DEST_ID,
            "data": DATA_TEMPLATE,
            "requested": self.requested,
            "replayed": max(self.replayed, 1),
        }

    # old finished history: one event, one delivery, one attempt each
    def old_rows(self, lo: int, hi: int) -> Batch:
        events: Rows = []
        deliveries: Rows = []
        attempts: Rows = []
        for i in range(lo, hi):
            p = f"{i:010d}"
            t = self.old_base + i * self.step
            done = t + 0.5 + (i * 7919 % 3000) / 1000
            failed = i % 50 == 0
            duration = 40 + i % 200
            events.append(
                (
                    f"evt_old{p}",
                    TENANT,
                    EVENT_TYPE,
                    DATA_TEMPLATE % (p, 30000 + i % 90000),
                    iso_ms(t - 0.5),
                    t - 0.5,
                    t,
                )
            )
            deliveries.append(
                (
                    f"dlv_old{p}",
                    TENANT,
                    f"evt_old{p}",
                    EVENT_TYPE,
                    DEST_ID,
                    "event",
                    "failure" if failed else "success",
                    1,
                    11,
                    None,
                    0,
                    None,
                    t + 0.01,
                    done,
                    f"att_old{p}",
                )
            )
            attempts.append(
                (
                    f"att_old{p}",
                    f"dlv_old{p}",
                    1,
                    done - duration / 1000,
                    float(duration),
                    "failure_permanent" if failed else "success",
                    410 if failed else 204,
                    None,
                    '{"error":"gone"}' if failed else None,
                )
            )
        return events, deliveries, attempts

    # scheduled retries: recent event, 3 recent attempts, due in 2-6 h
    def scheduled_rows(self, lo: int, hi: int) -> Batch:
        events: Rows = []
        deliveries: Rows = []
        attempts: Rows = []
        for j in range(lo, hi):
            p = f"{j:010d}"
            t = self.now - 3600 - j % 3600
            updated = self.now - 600 + j % 300
            events.append(
                (
                    f"evt_pnd{p}",
                    TENANT,
                    EVENT_TYPE,
                    DATA_TEMPLATE % (p, 30000 + j % 90000),
                    iso_ms(t - 0.5),
                    t - 0.5,
                    t,
                )
            )
            deliveries.append(
                (
                    f"dlv_pnd{p}",
                    TENANT,
                    f"evt_pnd{p}",
                    EVENT_TYPE,
                    DEST_ID,
                    "event",
                    "pending",
                    3,
                    11,
                    self.now + 7200 + j * 7919 % 14400,
                    0,
                    None,
                    t + 0.01,
                    updated,
                    f"att_pnd{p}3",
                )
            )
            attempts.extend(
                (
                    f"att_pnd{p}{k}",
                    f"dlv_pnd{p}",
                    k,
                    updated - (3 - k) * 60 - 1,
                    100.0,
                    "failure_retryable",
                    503,
                    None,
                    "busy",
                )
                for k in (1, 2, 3)
            )
        return events, deliveries, attempts

    # replayed deliveries: old event and first attempt, 2 recent attempts, due in 2-6 h
    def replayed_rows(self, lo: int, hi: int) -> Batch:
        events: Rows = []
        deliveries: Rows = []
        attempts: Rows = []
        for j in range(lo, hi):
            p = f"{j:010d}"
            t = self.old_base + (j * self.requested // max(self.replayed, 1)) * self.step
            t += self.step / 2
            updated = self.now - 1800 + j % 600
            events.append(
                (
                    f"evt_rpl{p}",
                    TENANT,
                    EVENT_TYPE,
                    DATA_TEMPLATE % (p, 30000 + j % 90000),
                    iso_ms(t - 0.5),
                    t - 0.5,
                    t,
                )
            )
            deliveries.append(
                (
                    f"dlv_rpl{p}",
                    TENANT,
                    f"evt_rpl{p}",
                    EVENT_TYPE,
                    DEST_ID,
                    "event",
                    "pending",
                    3,
                    12,
                    self.now + 7200 + j * 7919 % 14400,
                    0,
                    None,
                    t + 0.01,
                    updated,
                    f"att_rpl{p}3",
                )
            )
            attempts.append(
                (f"att_rpl{p}1", f"dlv_rpl{p}", 1, t + 1, 80.0, "failure_permanent", 410, None, "")
            )
            attempts.extend(
                (
                    f"att_rpl{p}{k}",
                    f"dlv_rpl{p}",
                    k,
                    updated - (3 - k) * 60 - 1,
                    100.0,
                    "failure_retryable",
                    503,
                    None,
                    "busy",
                )
                for k in (2, 3)
            )
        return events, deliveries, attempts

    def rejected_rows(self, count: int) -> Rows:
        return [
            (
                s,
                f"evt_rej{s:010d}",
                TENANT,
                EVENT_TYPE,
                "{not json",
                iso_ms(self.old_base + s),
                "data is not valid JSON",
                self.old_base + s,
            )
            for s in range(1, count + 1)
        ]


EVENT_INSERT = (
    "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
DELIVERY_INSERT = (
    "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,"
    " status, attempt_count, max_attempts, next_attempt_at, held, lease_owner, created_at,"
    " updated_at, last_attempt_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
ATTEMPT_INSERT = (
    "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
    " response_status, error, response_excerpt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
REJECTED_INSERT = (
    "INSERT INTO herald_outbox_rejected (seq, id, tenant_id, type, data, created_at, reason,"
    " rejected_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)

# PostgreSQL: the same rows as Shape's methods, generated by the server.
_PG_ISO = "to_char(to_timestamp({t}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
_PG_SERIES = (
    "FROM (SELECT i, lpad(i::text, 10, '0') AS p, {t} AS t"
    " FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i) AS s"
)
_PG_OLD = _PG_SERIES.format(t="%(base)s + i * %(step)s")
_PG_DONE = "t + 0.5 + (i * 7919 %% 3000) / 1000.0"
PG_OLD = [
    "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at)"
    " SELECT 'evt_old' || p, %(tenant)s, %(type)s, format(%(data)s, p, 30000 + i %% 90000),"
    f" {_PG_ISO.format(t='t - 0.5')}, t - 0.5, t {_PG_OLD}",
    "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,"
    " status, attempt_count, max_attempts, next_attempt_at, held, lease_owner, created_at,"
    " updated_at, last_attempt_id)"
    " SELECT 'dlv_old' || p, %(tenant)s, 'evt_old' || p, %(type)s, %(dest)s, 'event',"
    " CASE WHEN i %% 50 = 0 THEN 'failure' ELSE 'success' END, 1, 11, NULL, 0, NULL,"
    f" t + 0.01, {_PG_DONE}, 'att_old' || p {_PG_OLD}",
    "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
    " response_status, error, response_excerpt)"
    f" SELECT 'att_old' || p, 'dlv_old' || p, 1, {_PG_DONE} - (40 + i %% 200) / 1000.0,"
    " 40 + i %% 200,"
    " CASE WHEN i %% 50 = 0 THEN 'failure_permanent' ELSE 'success' END,"
    " CASE WHEN i %% 50 = 0 THEN 410 ELSE 204 END, NULL,"
    ' CASE WHEN i %% 50 = 0 THEN \'{"error":"gone"}\' END'
    f" {_PG_OLD}",
]
_PG_SCHED = _PG_SERIES.format(t="%(now)s - 3600 - i %% 3600")
PG_SCHEDULED = [
    "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at)"
    " SELECT 'evt_pnd' || p, %(tenant)s, %(type)s, format(%(data)s, p, 30000 + i %% 90000),"
    f" {_PG_ISO.format(t='t - 0.5')}, t - 0.5, t {_PG_SCHED}",
    "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,"
    " status, attempt_count, max_attempts, next_attempt_at, held, lease_owner, created_at,"
    " updated_at, last_attempt_id)"
    " SELECT 'dlv_pnd' || p, %(tenant)s, 'evt_pnd' || p, %(type)s, %(dest)s, 'event',"
    " 'pending', 3, 11, %(now)s + 7200 + i * 7919 %% 14400, 0, NULL, t + 0.01,"
    f" %(now)s - 600 + i %% 300, 'att_pnd' || p || '3' {_PG_SCHED}",
    "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
    " response_status, error, response_excerpt)"
    " SELECT 'att_pnd' || p || k, 'dlv_pnd' || p, k, %(now)s - 600 + i %% 300 - (3 - k) * 60 - 1,"
    " 100, 'failure_retryable', 503, NULL, 'busy'"
    f" {_PG_SCHED} CROSS JOIN generate_series(1, 3) AS k",
]
_PG_RPL = _PG_SERIES.format(
    t="%(base)s + (i * %(requested)s / %(replayed)s) * %(step)s + %(step)s / 2"
)
PG_REPLAYED = [
    "INSERT INTO herald_events (id, tenant_id, type, data, created_at, created_ts, ingested_at)"
    " SELECT 'evt_rpl' || p, %(tenant)s, %(type)s, format(%(data)s, p, 30000 + i %% 90000),"
    f" {_PG_ISO.format(t='t - 0.5')}, t - 0.5, t {_PG_RPL}",
    "INSERT INTO herald_deliveries (id, tenant_id, event_id, event_type, destination_id, kind,"
    " status, attempt_count, max_attempts, next_attempt_at, held, lease_owner, created_at,"
    " updated_at, last_attempt_id)"
    " SELECT 'dlv_rpl' || p, %(tenant)s, 'evt_rpl' || p, %(type)s, %(dest)s, 'event',"
    " 'pending', 3, 12, %(now)s + 7200 + i * 7919 %% 14400, 0, NULL, t + 0.01,"
    f" %(now)s - 1800 + i %% 600, 'att_rpl' || p || '3' {_PG_RPL}",
    "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
    " response_status, error, response_excerpt)"
    " SELECT 'att_rpl' || p || '1', 'dlv_rpl' || p, 1, t + 1, 80, 'failure_permanent', 410,"
    f" NULL, '' {_PG_RPL}",
    "INSERT INTO herald_attempts (id, delivery_id, number, started_at, duration_ms, outcome,"
    " response_status, error, response_excerpt)"
    " SELECT 'att_rpl' || p || k, 'dlv_rpl' || p, k, %(now)s - 1800 + i %% 600 - (3 - k) * 60 - 1,"
    " 100, 'failure_retryable', 503, NULL, 'busy'"
    f" {_PG_RPL} CROSS JOIN generate_series(2, 3) AS k",
]
PG_REJECTED = (
    "INSERT INTO herald_outbox_rejected (seq, id, tenant_id, type, data, created_at, reason,"
    " rejected_at) SELECT s, 'evt_rej' || lpad(s::text, 10, '0'), %(tenant)s, %(type)s,"
    f" '{{not json', {_PG_ISO.format(t='%(base)s + s')}, 'data is not valid JSON',"
    " %(base)s + s FROM generate_series(1, %(hi)s::bigint) AS s"
)


@dataclass(slots=True)
class Loaded:
    rows: int
    seconds: float
    note: str = ""


def _chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, total, size):
        yield lo, min(lo + size, total)


def load_postgres(db: Database, shape: Shape, deadline: Deadline) -> Loaded:
    t0 = time.perf_counter()
    with db.connect() as conn:

        def run(statements: Sequence[str], params: dict[str, Any]) -> None:
            deadline.check("loading")
            ms = max(int(deadline.remaining * 1000), 1)
            with conn.transaction():
                conn.execute(f"SET LOCAL statement_timeout = {ms}")
                for sql in statements:
                    conn.execute(sql, params)

        for lo, hi in _chunks(shape.requested, PG_CHUNK):
            run(PG_OLD, shape.pg_params(lo, hi))
            log(f"postgres: {hi:,}/{shape.requested:,} old rows ({time.perf_counter() - t0:.0f} s)")
        for lo, hi in _chunks(shape.scheduled, PG_CHUNK):
            run(PG_SCHEDULED, shape.pg_params(lo, hi))
        for lo, hi in _chunks(shape.replayed, PG_CHUNK):
            run(PG_REPLAYED, shape.pg_params(lo, hi))
        run([PG_REJECTED], shape.pg_params(0, shape.rejected))
        loaded = time.perf_counter() - t0
        log(f"postgres: loaded in {loaded:.1f} s; VACUUM ANALYZE")
        conn.execute(f"SET statement_timeout = {max(int(deadline.remaining * 1000), 1)}")
        for table in TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
    return Loaded(shape.requested, loaded)


def load_sqlite(path: Path, shape: Shape, deadline: Deadline, *, budget: float) -> Loaded:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    target, note = shape.requested, ""
    t0 = time.perf_counter()

    def insert(rows: Batch) -> None:
        deadline.check("loading")
        events, deliveries, attempts = rows
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(EVENT_INSERT, events)
        conn.executemany(DELIVERY_INSERT, deliveries)
        conn.executemany(ATTEMPT_INSERT, attempts)
        conn.execute("COMMIT")

    try:
        conn.execute("PRAGMA synchronous=OFF")  # the bench's own bulk load, not Herald's
        done = 0
        while done < target:
            hi = min(done + SQLITE_CHUNK, target)
            insert(shape.old_rows(done, hi))
            done = hi
            elapsed = time.perf_counter() - t0
            projected = elapsed * target / done
            if target > SQLITE_FALLBACK and done < SQLITE_FALLBACK and projected > budget:
                note = (
                    f"loading {target:,} rows into SQLite would take about {projected:.0f} s"
                    f" here (budget {budget:g} s): used {SQLITE_FALLBACK:,} instead"
                )
                log(note)
                target = SQLITE_FALLBACK
            if done % (SQLITE_CHUNK * 4) == 0 or done == target:
                log(f"sqlite: {done:,}/{target:,} old rows ({elapsed:.0f} s)")
        for lo, hi in _chunks(shape.scheduled, SQLITE_CHUNK):
            insert(shape.scheduled_rows(lo, hi))
        for lo, hi in _chunks(shape.replayed, SQLITE_CHUNK):
            insert(shape.replayed_rows(lo, hi))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(REJECTED_INSERT, shape.rejected_rows(min(shape.rejected, target)))
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return Loaded(target, time.perf_counter() - t0, note)


# --- checks and sizes -------------------------------------------------------------------
def _prefix_count(db: Database, table: str, prefix: str) -> int:
    return db.count(f"SELECT COUNT(*) FROM {table} WHERE substr(id, 1, 7) = ?", (prefix,))


def census(db: Database, cutoff: float) -> dict[str, int]:
    """Row counts by origin, and the orphans/leftovers the purge must never produce."""
    out = {
        f"{table}.{prefix[4:]}": _prefix_count(db, table, prefix)
        for table, prefixes in (
            ("herald_deliveries", ("dlv_old", "dlv_pnd", "dlv_rpl")),
            ("herald_events", ("evt_old", "evt_pnd", "evt_rpl")),
            ("herald_attempts", ("att_old", "att_pnd", "att_rpl")),
        )
        for prefix in prefixes
    }
    out["herald_outbox_rejected.old"] = db.count(
        "SELECT COUNT(*) FROM herald_outbox_rejected WHERE rejected_at < ?", (cutoff,)
    )
    out["finished_before_cutoff"] = db.count(
        "SELECT COUNT(*) FROM herald_deliveries WHERE status <> 'pending' AND updated_at < ?",
        (cutoff,),
    )
    out["pending"] = db.count("SELECT COUNT(*) FROM herald_deliveries WHERE status = 'pending'")
    out["deliveries_without_event"] = db.count(
        "SELECT COUNT(*) FROM herald_deliveries d"
        " WHERE NOT EXISTS (SELECT 1 FROM herald_events e WHERE e.id = d.event_id)"
    )
    out["attempts_without_delivery"] = db.count(
        "SELECT COUNT(*) FROM herald_attempts a"
        " WHERE NOT EXISTS (SELECT 1 FROM herald_deliveries d WHERE d.id = a.delivery_id)"
    )
    return out


def expect(census_: dict[str, int], wanted: dict[str, int], when: str) -> None:
    wrong = {k: (census_.get(k), v) for k, v in wanted.items() if census_.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k}: {got} (expected {exp})" for k, (got, exp) in wrong.items())
        raise BenchError(f"{when}: {detail}")


def expected(shape: Shape, rows: int, rejected: int, *, purged: bool) -> dict[str, int]:
    old = 0 if purged else rows
    return {
        "herald_deliveries.old": old,
        "herald_deliveries.pnd": shape.scheduled,
        "herald_deliveries.rpl": shape.replayed,
        "herald_events.old": old,
        "herald_events.pnd": shape.scheduled,
        "herald_events.rpl": shape.replayed,
        "herald_attempts.old": old,
        "herald_attempts.pnd": 3 * shape.scheduled,
        "herald_attempts.rpl": 3 * shape.replayed,
        "herald_outbox_rejected.old": 0 if purged else rejected,
        "finished_before_cutoff": old,
        "pending": shape.pending,
        "deliveries_without_event": 0,
        "attempts_without_delivery": 0,
    }


def _mb(n: float) -> float:
    return round(n / 2**20, 1)


def sizes(db: Database) -> dict[str, float]:
    """MiB per table (indexes and TOAST included) and for the whole database."""
    if db.kind == "postgres":
        out = {t: _mb(db.count("SELECT pg_total_relation_size(?::regclass)", (t,))) for t in TABLES}
        out["database"] = _mb(db.count("SELECT pg_database_size(current_database())"))
        out["dead_tuples"] = float(
            db.count(
                "SELECT COALESCE(SUM(n_dead_tup), 0) FROM pg_stat_user_tables"
                f" WHERE relname IN ({', '.join(repr(t) for t in TABLES)})"
            )
        )
        return out
    assert db.path is not None
    path = db.path
    wal = path.with_name(path.name + "-wal")
    with db.connect(readonly=True) as conn:
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        out = {
            "file": _mb(path.stat().st_size),
            "wal": _mb(wal.stat().st_size if wal.exists() else 0),
            "pages": _mb(pages * page),
            "freelist": _mb(free * page),
        }
        try:
            owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master").fetchall())
            per: dict[str, int] = {}
            for name, size in conn.execute(
                "SELECT name, pgsize FROM dbstat WHERE aggregate = TRUE"
            ).fetchall():
                table = owner.get(name, name)
                per[table] = per.get(table, 0) + int(size)
            out.update({t: _mb(per.get(t, 0)) for t in TABLES})
        except sqlite3.Error:  # no dbstat in this SQLite build
            pass
    return out


# --- the purge's statements: plans and cost -------------------------------------------
PURGE_SELECT = (
    "SELECT id FROM herald_deliveries WHERE status <> 'pending'"
    " AND updated_at < {1} ORDER BY updated_at LIMIT {2}"
)
PURGE_EVENTS = (
    "DELETE FROM herald_events WHERE id IN (SELECT e.id FROM herald_events e"
    " WHERE e.ingested_at < {1} AND NOT EXISTS (SELECT 1 FROM herald_deliveries d"
    " WHERE d.event_id = e.id) LIMIT {2})"
)
# PostgreSQL (PostgresDialect.purge_deliveries, queries purge_events_of and
# purge_unused_events): the events of the deliveries just deleted, by id; then, at the
# end of a pass, the events no delivery ever used, oldest first.
PG_PURGE_EVENTS = (
    "DELETE FROM herald_events e WHERE e.id = ANY({1}) AND e.ingested_at < {2}"
    " AND NOT EXISTS (SELECT 1 FROM herald_deliveries d WHERE d.event_id = e.id)"
)
PG_SWEEP_EVENTS = (
    "DELETE FROM herald_events WHERE id IN (SELECT e.id FROM herald_events e"
    " WHERE e.ingested_at < {1} AND (SELECT 1 FROM herald_deliveries d"
    " WHERE d.event_id = e.id LIMIT 1) IS NULL ORDER BY e.ingested_at LIMIT {2})"
)
PURGE_REJECTED = (
    "DELETE FROM herald_outbox_rejected WHERE seq IN (SELECT seq FROM"
    " herald_outbox_rejected WHERE rejected_at < {1} LIMIT {2})"
)


def _pg_explain(conn: Any, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", tuple(params)).fetchall()
    return {"ms": round((time.perf_counter() - t0) * 1000, 1), "plan": [_clip(r[0]) for r in rows]}


def _clip(line: str, keep: int = 240) -> str:
    """A plan line, its 5,000-id array literal cut short."""
    return line if len(line) <= keep else f"{line[:keep]}… ({len(line):,} chars)"


def plans_postgres(db: Database, cutoff: float, limit: int) -> dict[str, Any]:
    """One purge batch's statements under EXPLAIN ANALYZE, rolled back; the two scans
    also as the generic plan a prepared statement (asyncpg) may switch to."""
    out: dict[str, Any] = {}
    with db.connect() as conn, conn.transaction(force_rollback=True):
        select = PURGE_SELECT.replace("{1}", "%s").replace("{2}", "%s")
        out["select_finished"] = _pg_explain(
            conn, select + " FOR UPDATE SKIP LOCKED", (cutoff, limit)
        )
        ids = [r[0] for r in conn.execute(select, (cutoff, limit)).fetchall()]
        event_ids = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT event_id FROM herald_deliveries WHERE id = ANY(%s)", (ids,)
            ).fetchall()
        ]
        out["delete_attempts"] = _pg_explain(
            conn, "DELETE FROM herald_attempts WHERE delivery_id = ANY(%s)", (ids,)
        )
        out["delete_deliveries"] = _pg_explain(
            conn, "DELETE FROM herald_deliveries WHERE id = ANY(%s)", (ids,)
        )
        events = PG_PURGE_EVENTS.replace("{1}", "%s").replace("{2}", "%s")
        out["delete_events"] = _pg_explain(conn, events, (event_ids, cutoff))
        conn.execute("SET LOCAL jit = off")
        sweep = PG_SWEEP_EVENTS.replace("{1}", "%s").replace("{2}", "%s")
        out["sweep_events"] = _pg_explain(conn, sweep, (cutoff, limit))
        rejected = PURGE_REJECTED.replace("{1}", "%s").replace("{2}", "%s")
        out["delete_rejected"] = _pg_explain(conn, rejected, (cutoff, limit))
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        for name, sql in (("select_finished", PURGE_SELECT), ("sweep_events", PG_SWEEP_EVENTS)):
            conn.execute(f"PREPARE bench_{name} AS {sql.replace('{1}', '$1').replace('{2}', '$2')}")
            out[f"{name}_generic"] = _pg_explain(conn, f"EXECUTE bench_{name}({cutoff!r}, {limit})")
            conn.execute(f"DEALLOCATE bench_{name}")
    return out


def plans_sqlite(db: Database, cutoff: float, limit: int) -> dict[str, Any]:
    """EXPLAIN QUERY PLAN of each statement, and its time in a rolled-back transaction."""
    out: dict[str, Any] = {}
    with db.connect() as conn:

        def step(name: str, sql: str, params: Sequence[Any]) -> list[Any]:
            plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()]
            t0 = time.perf_counter()
            rows: list[Any] = conn.execute(sql, params).fetchall()
            out[name] = {"ms": round((time.perf_counter() - t0) * 1000, 1), "plan": plan}
            return rows

        conn.execute("BEGIN IMMEDIATE")
        try:
            sel = PURGE_SELECT.replace("{1}", "?").replace("{2}", "?")
            ids = [r[0] for r in step("select_finished", sel, (cutoff, limit))]
            marks = ",".join("?" * len(ids)) or "NULL"
            step(
                "delete_attempts",
                f"DELETE FROM herald_attempts WHERE delivery_id IN ({marks})",
                ids,
            )
            step("delete_deliveries", f"DELETE FROM herald_deliveries WHERE id IN ({marks})", ids)
            ev = PURGE_EVENTS.replace("{1}", "?").replace("{2}", "?")
            step("delete_events", ev, (cutoff, limit))
            rej = PURGE_REJECTED.replace("{1}", "?").replace("{2}", "?")
            step("delete_rejected", rej, (cutoff, limit))
        finally:
            conn.execute("ROLLBACK")
    return out


def plans(db: Database, cutoff: float, limit: int) -> dict[str, Any]:
    if db.kind == "postgres":
        return plans_postgres(db, cutoff, limit)
    return plans_sqlite(db, cutoff, limit)


# --- the measurements through Herald's store ---------------------------------------------
def _ms_summary(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "p50_ms": round(percentile(ordered, 50) * 1000, 3),
        "p99_ms": round(percentile(ordered, 99) * 1000, 3),
        "max_ms": round((ordered[-1] if ordered else float("nan")) * 1000, 3),
    }


@dataclass(slots=True)
class PurgeRun:
    batch_seconds: list[float] = field(default_factory=list)
    purged: int = 0
    seconds: float = 0.0
    baseline: dict[str, list[float]] = field(default_factory=dict)
    during: dict[str, list[float]] = field(default_factory=dict)


def _scheduling(store: Store, claim_batch: int) -> dict[str, Callable[[], Awaitable[object]]]:
    async def claim() -> object:
        now = time.time()
        got = await store.claim_due(now=now, limit=claim_batch, owner=OWNER, lease_until=now + 300)
        if got:
            raise BenchError(f"claim_due took {len(got)} deliveries: expected none due")
        return got

    async def next_due() -> object:
        return await store.next_due_at()

    async def counts() -> object:
        return await store.delivery_counts(now=time.time())

    return {"claim_due": claim, "next_due_at": next_due, "delivery_counts": counts}


async def measure(
    config: Path,
    *,
    cutoff: float,
    batch: int,
    repeat: int,
    interval: float,
    timeout: float,
    purge_timeout: float,
) -> PurgeRun:
    from herald.config import load_settings
    from herald.wiring import components

    settings = load_settings(config)
    result = PurgeRun()
    async with components(settings) as comp:
        store = comp.store
        queries = _scheduling(store, settings.delivery.claim_batch_size)

        base = Deadline("baseline", timeout)
        for name, fn in queries.items():
            await fn()  # warm the page cache and the statement cache
            times = []
            for _ in range(repeat):
                base.check(name)
                t0 = time.perf_counter()
                await fn()
                times.append(time.perf_counter() - t0)
            result.baseline[name] = times

        done = asyncio.Event()
        result.during = {name: [] for name in queries}

        async def sampler() -> None:
            rounds = 0
            while not done.is_set():
                names = SCHED_QUERIES if rounds % 10 == 0 else SCHED_QUERIES[:2]
                for name in names:
                    t0 = time.perf_counter()
                    await queries[name]()
                    result.during[name].append(time.perf_counter() - t0)
                    await asyncio.sleep(interval)
                rounds += 1

        deadline = Deadline("purge", purge_timeout)
        task = asyncio.create_task(sampler(), name="bench-sampler")
        await asyncio.sleep(interval)  # let the sampler start before the first batch
        t_start = last_log = time.perf_counter()
        try:
            while True:
                deadline.check(f"{result.purged:,} deliveries purged")
                if task.done():
                    task.result()  # the sampler failed: say why now
                t0 = time.perf_counter()
                try:
                    removed = await asyncio.wait_for(
                        store.purge(before=cutoff, limit=batch), timeout=max(deadline.remaining, 1)
                    )
                except TimeoutError as exc:
                    raise BenchError(
                        f"phase 'purge' exceeded its {purge_timeout:g} s limit in a batch"
                        f" ({result.purged:,} deliveries purged)"
                    ) from exc
                result.batch_seconds.append(time.perf_counter() - t0)
                result.purged += removed
                if time.perf_counter() - last_log > 10:
                    last_log = time.perf_counter()
                    log(
                        f"purge: {result.purged:,} deliveries in {last_log - t_start:.0f} s,"
                        f" last batch {result.batch_seconds[-1] * 1000:.0f} ms"
                    )
                if removed < batch:
                    break
                await asyncio.sleep(0)  # as the daemon's retention task does
            result.seconds = time.perf_counter() - t_start
        finally:
            done.set()
            try:
                await asyncio.wait_for(task, timeout=60)
            except BaseException:
                task.cancel()
                raise
    return result


# --- one backend ------------------------------------------------------------------------
def run_backend(
    kind: str, args: argparse.Namespace, requested: int, pending: int
) -> dict[str, Any]:
    from herald.config import RetentionSettings

    retention = RetentionSettings()
    batch = args.batch_size or retention.batch_size
    load_start = load_avg()
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as scratch:
        workdir = Path(scratch)
        dbs: contextlib.AbstractContextManager[Database]
        if kind == "postgres":
            dbs = postgres_database()
        else:
            dbs = contextlib.nullcontext(Database.sqlite(workdir / "herald.db"))
        with dbs as db:
            inst = HeraldInstance(workdir, db=db, name=f"herald-{kind}")
            inst.migrate()
            shape = Shape(requested=requested, pending=pending, now=time.time())
            log(f"{kind}: loading {requested:,} finished + {pending:,} pending deliveries")
            load_deadline = Deadline(f"load {kind}", args.insert_budget + args.timeout)
            if kind == "postgres":
                loaded = load_postgres(db, shape, load_deadline)
            else:
                assert db.path is not None
                loaded = load_sqlite(db.path, shape, load_deadline, budget=args.insert_budget)
            log(f"{kind}: {loaded.rows:,} old rows loaded in {loaded.seconds:.1f} s")
            rejected = min(shape.rejected, loaded.rows)
            cutoff = time.time() - retention.days * DAY
            before = census(db, cutoff)
            expect(before, expected(shape, loaded.rows, rejected, purged=False), "after loading")
            size_before = sizes(db)
            plans_before = plans(db, cutoff, batch)
            log(f"{kind}: sizes {size_before}; baseline, then purge")
            purge_run = asyncio.run(
                measure(
                    inst.config_path,
                    cutoff=cutoff,
                    batch=batch,
                    repeat=args.repeat,
                    interval=args.sample_interval,
                    timeout=args.timeout,
                    purge_timeout=args.purge_timeout,
                )
            )
            log(f"{kind}: purged {purge_run.purged:,} in {purge_run.seconds:.1f} s; checking")
            after = census(db, cutoff)
            expect(after, expected(shape, loaded.rows, rejected, purged=True), "after the purge")
            if purge_run.purged != loaded.rows:
                raise BenchError(f"purge() reported {purge_run.purged:,}, expected {loaded.rows:,}")
            size_after = sizes(db)
            plans_after = plans(db, cutoff, batch)
            size_vacuum: dict[str, float] | None = None
            if kind == "postgres":
                with db.connect() as conn:
                    conn.execute(f"SET statement_timeout = {int(args.timeout * 1000)}")
                    for table in TABLES:
                        conn.execute(f"VACUUM {table}")
                size_vacuum = sizes(db)
            server = _server_settings(db)
    result = _backend_result(
        kind,
        loaded=loaded,
        shape=shape,
        batch=batch,
        retention_days=retention.days,
        run=purge_run,
        census_before=before,
        census_after=after,
        sizes_={"before": size_before, "after_purge": size_after, "after_vacuum": size_vacuum},
        plans_={"start": plans_before, "end": plans_after},
        server=server,
    )
    result["load_avg_1m"] = [load_start, load_avg()]
    return result


def _server_settings(db: Database) -> dict[str, Any]:
    if db.kind == "postgres":
        names = ("server_version", "shared_buffers", "work_mem", "autovacuum", "fsync")
        return {n: db.scalar(f"SHOW {n}") for n in names}
    with db.connect(readonly=True) as conn:
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "page_size": conn.execute("PRAGMA page_size").fetchone()[0],
            "auto_vacuum": conn.execute("PRAGMA auto_vacuum").fetchone()[0],
        }


def _backend_result(
    kind: str,
    *,
    loaded: Loaded,
    shape: Shape,
    batch: int,
    retention_days: float,
    run: PurgeRun,
    census_before: dict[str, int],
    census_after: dict[str, int],
    sizes_: dict[str, dict[str, float] | None],
    plans_: dict[str, Any],
    server: dict[str, Any],
) -> dict[str, Any]:
    ordered = sorted(run.batch_seconds)
    tenth = max(len(run.batch_seconds) // 10, 1)
    sched: dict[str, Any] = {}
    for name in SCHED_QUERIES:
        base = _ms_summary(run.baseline[name])
        during = _ms_summary(run.during[name])
        sched[name] = {
            "baseline": base,
            "during": during,
            "ratio_p50": round(during["p50_ms"] / base["p50_ms"], 2) if base["p50_ms"] else None,
            "ratio_p99": round(during["p99_ms"] / base["p99_ms"], 2) if base["p99_ms"] else None,
            "during_latency": latency_summary(run.during[name]),
        }
    return {
        "backend": kind,
        "rows": loaded.rows,
        "rows_requested": shape.requested,
        "rows_note": loaded.note or None,
        "pending": shape.pending,
        "pending_replayed_with_old_event": shape.replayed,
        "rejected_rows": min(shape.rejected, loaded.rows),
        "load_seconds": round(loaded.seconds, 1),
        "retention_days": retention_days,
        "batch_size": batch,
        "batches": len(run.batch_seconds),
        "purged": run.purged,
        "purge_seconds": round(run.seconds, 2),
        "purged_per_s": round(run.purged / run.seconds, 1) if run.seconds else None,
        "batch_ms_p50": round(percentile(ordered, 50) * 1000, 1),
        "batch_ms_p99": round(percentile(ordered, 99) * 1000, 1),
        "batch_ms_max": round(ordered[-1] * 1000, 1),
        "batch_ms_first_tenth_median": round(
            statistics.median(run.batch_seconds[:tenth]) * 1000, 1
        ),
        "batch_ms_last_tenth_median": round(
            statistics.median(run.batch_seconds[-tenth:]) * 1000, 1
        ),
        "batch_ms": [round(s * 1000, 1) for s in run.batch_seconds],
        "sched_query_ms": sched,
        "sizes_mb": sizes_,
        "rows_before": census_before,
        "rows_after": census_after,
        "plans": plans_,
        "server": server,
    }


# --- output -----------------------------------------------------------------------------
def _print(results: dict[str, dict[str, Any]]) -> None:
    print(
        grid(
            [
                "backend",
                "rows",
                "purge s",
                "purged/s",
                "batches",
                "batch p50 ms",
                "p99 ms",
                "max ms",
                "first 10% ms",
                "last 10% ms",
            ],
            [
                [
                    kind,
                    r["rows"],
                    r["purge_seconds"],
                    r["purged_per_s"],
                    r["batches"],
                    r["batch_ms_p50"],
                    r["batch_ms_p99"],
                    r["batch_ms_max"],
                    r["batch_ms_first_tenth_median"],
                    r["batch_ms_last_tenth_median"],
                ]
                for kind, r in results.items()
            ],
        )
    )
    print()
    rows: list[list[object]] = []
    for kind, r in results.items():
        for name in SCHED_QUERIES:
            q = r["sched_query_ms"][name]
            rows.append(
                [
                    f"{kind} {name}",
                    q["baseline"]["p50_ms"],
                    q["baseline"]["p99_ms"],
                    q["during"]["p50_ms"],
                    q["during"]["p99_ms"],
                    q["during"]["max_ms"],
                    q["during"]["n"],
                    f"x{q['ratio_p50']}",
                    f"x{q['ratio_p99']}",
                ]
            )
    print(
        grid(
            [
                "query (ms)",
                "base p50",
                "base p99",
                "purge p50",
                "purge p99",
                "purge max",
                "samples",
                "ratio p50",
                "ratio p99",
            ],
            rows,
        )
    )
    print()
    size_rows: list[list[object]] = []
    for kind, r in results.items():
        s = r["sizes_mb"]
        vac = s["after_vacuum"] or {}
        keys = [*TABLES, "database"] if kind == "postgres" else [*TABLES, "file", "freelist"]
        for key in keys:
            if key in s["before"]:
                size_rows.append(
                    [
                        f"{kind} {key}",
                        s["before"][key],
                        s["after_purge"][key],
                        vac.get(key, "-"),
                    ]
                )
    print(grid(["size (MiB)", "before", "after purge", "after VACUUM"], size_rows))
    print()
    print(
        grid(
            ["one batch, rolled back (ms)", *STATEMENTS],
            [
                [
                    f"{kind} {when}",
                    *(r["plans"][when].get(name, {}).get("ms", "-") for name in STATEMENTS),
                ]
                for kind, r in results.items()
                for when in ("start", "end")
            ],
        )
    )
    for kind, r in results.items():
        for name in ("delete_events", "sweep_events"):
            if name in r["plans"]["start"]:
                plan = r["plans"]["start"][name]["plan"]
                print(f"\n{kind}: the purge's {name} at the start\n  " + "\n  ".join(plan))


def run(args: argparse.Namespace) -> int:
    quick = args.quick
    requested = args.rows or (QUICK_ROWS if quick else ROWS)
    pending = args.pending or (QUICK_PENDING if quick else PENDING)
    kinds = [k.strip() for k in args.backends.split(",") if k.strip()]
    unknown = set(kinds) - set(BACKENDS)
    if unknown or not kinds:
        raise BenchError(f"--backends: expected some of {', '.join(BACKENDS)}")
    load_before = load_avg()
    results: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        results[kind] = run_backend(kind, args, requested, pending)
    load_after = load_avg()
    print(
        f"\nretention purge: {requested:,} finished deliveries (40-41 days old, 1 event +"
        f" 1 attempt each) + {pending:,} scheduled retries kept; {machine()}"
    )
    for kind, r in results.items():
        if r["rows_note"]:
            print(f"NOTE ({kind}): {r['rows_note']}")
        before, after = r["load_avg_1m"]
        print(
            f"{kind}: loaded in {r['load_seconds']:g} s; load average (1 min) before/after:"
            f" {before}/{after}"
        )
    print()
    _print(results)
    result: dict[str, Any] = {
        "rows": requested,
        "pending": pending,
        "backends": results,
        **{
            f"{kind}_{key}": r[key]
            for kind, r in results.items()
            for key in ("rows", "purge_seconds", "purged_per_s")
        },
        "date": iso_now(),
        "machine": machine(),
        "load_avg_1m": [load_before, load_after],
    }
    if quick:
        result["quick"] = True
    write_named(NAME, result, quick=quick)
    return 0
